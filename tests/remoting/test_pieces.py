"""A binary answer built from pieces (:meth:`remoting.router.Response.of_pieces`): which pieces are kept as they
are and which are joined, and that a real server sends the body as the pieces back to back either way."""

from __future__ import annotations

import asyncio

import pytest

from remoting.router import Request, Response, Router
from tests.serving import serving


@pytest.mark.parametrize(
    ("sizes", "buffers"),
    [
        ([40, 200_000], 2),  # a pull head and one large run: sent as they are
        ([40] + [10_000] * 15, 16),  # large, 16 pieces: the most sent one by one
        ([40] + [10_000] * 16, 1),  # 17 pieces: joined
        ([40, 1_000, 1_000], 1),  # small: joined
        ([40], 1),
    ],
)
def test_pieces_are_sent_as_they_are_only_when_large_and_few(sizes: list[int], buffers: int) -> None:
    pieces = [bytes([65 + i % 26]) * n for i, n in enumerate(sizes)]
    answer = Response.of_pieces(pieces)
    assert 1 + len(answer.tail) == buffers
    assert answer.length == sum(sizes)
    assert answer.body + b"".join(answer.tail) == b"".join(pieces)

    async def handler(request: Request) -> Response:
        return Response.of_pieces(pieces)

    async def main() -> None:
        async with serving(Router({("GET", "/p"): handler}, max_body_bytes=1024)) as client:
            r = await client.get("/p")
            assert r.status_code == 200 and r.headers["content-length"] == str(sum(sizes))
            assert r.content == b"".join(pieces)

    asyncio.run(main())


def test_a_request_reads_its_query_from_the_raw_string_once_and_keys_it_only_then() -> None:
    raw = b"topic=T&queueId=0&tag=a%20b"
    lazy = Request("POST", "/send", None, b"", ("127.0.0.1", 1), raw)
    assert lazy.query_key == raw
    assert lazy.query == {"topic": "T", "queueId": "0", "tag": "a b"}
    assert lazy.query is lazy.query  # parsed once
    given = Request("POST", "/send", {"topic": "U"}, b"", ("127.0.0.1", 1), raw)
    assert given.query == {"topic": "U"} and given.query_key is None  # the arguments are not the raw string's
    assert Request("GET", "/x", None, b"", ("", 0)).query == {}
