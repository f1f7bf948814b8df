"""The servers bound the bytes of request bodies held at once, not only one body's size: an upload past the bound
is refused with SYSTEM_BUSY (HTTP 503) as it arrives, and the bytes are released when a request ends. A real
server on loopback (tests/serving.py), several connections at once."""

from __future__ import annotations

import asyncio

from remoting.router import Request, Response, Router
from tests.serving import serving
from tests.waiting import wait_until

CHUNK = 64 * 1024


def test_bodies_in_flight_are_bounded_across_connections_and_released() -> None:
    handled: list[int] = []

    async def main() -> None:
        gate = asyncio.Event()

        async def handler(request: Request) -> Response:
            await gate.wait()  # the body stays in flight until the test lets the answer go
            handled.append(len(request.body))
            return Response(b"ok")

        router = Router({("POST", "/send"): handler}, max_body_bytes=16 * CHUNK, max_inflight_body_bytes=20 * CHUNK)
        async with serving(router) as client:
            held = []
            for n in (1, 2):  # two bodies of 8 chunks each, held by their handlers: 16 of the 20 allowed
                held.append(asyncio.create_task(client.post("/send", content=b"x" * 8 * CHUNK)))
                await wait_until(lambda n=n: router.body_bytes_in_flight == n * 8 * CHUNK, 10,  # type: ignore[misc]
                                 f"{n} bodies in flight")
            busy = await client.post("/send", content=b"y" * 8 * CHUNK)  # a third would pass the bound
            assert busy.status_code == 503, busy.text
            assert busy.json()["code"] == 2 and "in flight" in busy.json()["remark"]
            assert router.body_bytes_in_flight == 16 * CHUNK  # what the refused one had counted went back
            assert handled == []
            gate.set()
            assert [(await t).status_code for t in held] == [200, 200]
            assert handled == [8 * CHUNK] * 2
            assert router.body_bytes_in_flight == 0
            # Everything was released: a body as large as one may be fits now, beside nothing else.
            assert (await client.post("/send", content=b"z" * 16 * CHUNK)).status_code == 200
            assert router.body_bytes_in_flight == 0

    asyncio.run(main())
