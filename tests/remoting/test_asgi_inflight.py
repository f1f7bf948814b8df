"""The servers' Router bounds the bytes of request bodies held at once, not only one body's size: uploads past
the bound are refused with SYSTEM_BUSY (HTTP 503) as they arrive, and the bytes are released when a request ends."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from remoting.router import Request, Response, Router

CHUNK = 64 * 1024


class Upload:
    """One request whose body arrives chunk by chunk, when the test says so."""

    def __init__(self, chunks: int) -> None:
        self.left = chunks
        self.go = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if self.left > 1:
            await self.go.wait()
            self.go.clear()
        self.left -= 1
        return {"type": "http.request", "body": b"x" * CHUNK, "more_body": self.left > 0}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def answer(self) -> tuple[int, dict[str, Any] | bytes]:
        status = self.sent[0]["status"]
        body = self.sent[1]["body"]
        return status, (json.loads(body) if status != 200 else body)


def test_bodies_in_flight_are_bounded_and_released() -> None:
    handled: list[int] = []

    async def handler(request: Request) -> Response:
        handled.append(len(request.body))
        return Response(b"ok")

    async def main() -> None:
        router = Router({("POST", "/send"): handler}, max_body_bytes=16 * CHUNK, max_inflight_body_bytes=20 * CHUNK)
        scope = {"type": "http", "method": "POST", "path": "/send", "query_string": b""}
        uploads = [Upload(8) for _ in range(4)]  # 4 x 8 chunks = 32 chunks wanted at once, 20 allowed
        tasks = [asyncio.create_task(router(scope, u.receive, u.send)) for u in uploads]
        for _ in range(8):
            for u in uploads:
                u.go.set()
            await asyncio.sleep(0)  # let each reader take its chunk
            for _ in range(4):
                await asyncio.sleep(0)
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        answers = [u.answer() for u in uploads]
        ok = [a for a in answers if a[0] == 200]
        busy = [a for a in answers if a[0] == 503]
        assert len(ok) + len(busy) == 4 and ok and busy, answers  # 32 chunks wanted, 20 allowed: not all fit
        for _, err in busy:
            assert isinstance(err, dict) and err["code"] == 2 and "in flight" in err["remark"], err
        assert handled == [8 * CHUNK] * len(ok)
        # Everything was released: a body of the whole bound fits now.
        again = Upload(16)
        task = asyncio.create_task(router(scope, again.receive, again.send))
        for _ in range(16):
            again.go.set()
            for _ in range(3):
                await asyncio.sleep(0)
        await asyncio.wait_for(task, 5)
        assert again.answer()[0] == 200

    asyncio.run(main())
