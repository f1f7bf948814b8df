"""A binary answer built from pieces (:meth:`remoting.router.Response.of_pieces`): the ASGI messages the
Router sends for it, and that the body is the pieces back to back whichever way they are sent."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from remoting.router import Request, Response, Router


def _answer(pieces: list[bytes]) -> list[dict[str, Any]]:
    async def handler(request: Request) -> Response:
        return Response.of_pieces(pieces)

    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/p", "query_string": b"", "headers": [],
             "client": ("127.0.0.1", 1)}
    asyncio.run(Router({("GET", "/p"): handler}, max_body_bytes=1024)(scope, receive, send))
    return sent


@pytest.mark.parametrize(
    ("sizes", "messages"),
    [
        ([40, 200_000], 2),  # a pull head and one large run: sent as they are
        ([40] + [10_000] * 15, 16),  # large, 16 pieces: the most sent one by one
        ([40] + [10_000] * 16, 1),  # 17 pieces: joined
        ([40, 1_000, 1_000], 1),  # small: joined
        ([40], 1),
    ],
)
def test_pieces_are_sent_as_they_are_only_when_large_and_few(sizes: list[int], messages: int) -> None:
    pieces = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes)]
    start, *bodies = _answer(pieces)
    assert start["status"] == 200
    assert dict(start["headers"])[b"content-length"] == str(sum(sizes)).encode()
    assert len(bodies) == messages
    assert [m["more_body"] for m in bodies] == [True] * (messages - 1) + [False]
    assert b"".join(m["body"] for m in bodies) == b"".join(pieces)


def test_a_request_reads_its_query_from_the_raw_string_once_and_keys_it_only_then() -> None:
    raw = b"topic=T&queueId=0&tag=a%20b"
    lazy = Request("POST", "/send", None, b"", ("127.0.0.1", 1), raw)
    assert lazy.query_key == raw
    assert lazy.query == {"topic": "T", "queueId": "0", "tag": "a b"}
    assert lazy.query is lazy.query  # parsed once
    given = Request("POST", "/send", {"topic": "U"}, b"", ("127.0.0.1", 1), raw)
    assert given.query == {"topic": "U"} and given.query_key is None  # the arguments are not the raw string's
    assert Request("GET", "/x", None, b"", ("", 0)).query == {}
