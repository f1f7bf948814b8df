"""The broker's query-string parser reads exactly what urllib's parse_qsl reads."""

from __future__ import annotations

from urllib.parse import parse_qsl

from hypothesis import given
from hypothesis import strategies as st

from common.requests import parse_query

_ALPHABET = st.sampled_from([*"ab=&%+2AF1.é/ ", "%2A", "%ZZ", "%e9", "%C3%A9"])


@given(st.lists(_ALPHABET, max_size=16).map("".join))
def test_matches_parse_qsl(text: str) -> None:
    raw = text.encode("utf-8")
    assert parse_query(raw) == dict(parse_qsl(raw.decode("latin-1"), keep_blank_values=True))


def test_data_path_query() -> None:
    q = parse_query(b"group=g1&topic=T%25x&queueId=0&subExpression=%2A&empty=&flag")
    assert q == {"group": "g1", "topic": "T%x", "queueId": "0", "subExpression": "*", "empty": "", "flag": ""}
