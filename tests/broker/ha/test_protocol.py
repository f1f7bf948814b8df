"""The HA byte framing: examples from docs/BEHAVIOUR.md 2.3, errors, and arbitrary chunking (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ha.protocol import (
    FRAME_HEADER_SIZE,
    Frame,
    FrameDecoder,
    HAProtocolError,
    ReportDecoder,
    encode_frame_header,
    encode_report,
)


def test_report_example_from_the_spec() -> None:
    assert encode_report(258) == bytes.fromhex("0000000000000102")


def test_frame_header_example_from_the_spec() -> None:
    assert encode_frame_header(4096, 100) == bytes.fromhex("0000000000001000" "00000064")


@pytest.mark.parametrize(
    ("offset", "size", "field"),
    [(-1, 0, "phyOffset"), (0, -1, "bodySize"), (0, 1 << 31, "bodySize"), (1 << 63, 0, "phyOffset")],
)
def test_frame_header_rejects_out_of_range_fields(offset: int, size: int, field: str) -> None:
    with pytest.raises(HAProtocolError, match=field):
        encode_frame_header(offset, size)


def test_report_rejects_negative_offset() -> None:
    with pytest.raises(HAProtocolError, match="-5"):
        encode_report(-5)


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        ([b""], [None]),
        ([encode_report(7)], [7]),
        ([encode_report(7) + encode_report(9)], [9]),  # older queued reports are skipped
        ([encode_report(7)[:3], encode_report(7)[3:]], [None, 7]),
        ([encode_report(7) + encode_report(9)[:5], encode_report(9)[5:]], [7, 9]),
        ([encode_report(1)[:7], encode_report(1)[7:] + encode_report(2) + encode_report(3)[:1]], [None, 2]),
    ],
)
def test_report_decoder_uses_the_last_complete_report(chunks: list[bytes], expected: list[int | None]) -> None:
    dec = ReportDecoder()
    assert [dec.feed(c) for c in chunks] == expected


def test_report_decoder_rejects_negative_report() -> None:
    with pytest.raises(HAProtocolError, match="negative"):
        ReportDecoder().feed(b"\xff" * 8)


def _stream(frames: list[tuple[int, bytes]]) -> bytes:
    return b"".join(encode_frame_header(off, len(body)) + body for off, body in frames)


frames_strategy = st.lists(
    st.tuples(st.integers(0, (1 << 63) - 1), st.binary(max_size=300)), max_size=12
)


@settings(max_examples=200, deadline=None)
@given(frames=frames_strategy, cuts=st.lists(st.integers(0, 4000), max_size=20), capacity=st.integers(320, 700))
def test_any_chunking_decodes_to_the_same_frames(
    frames: list[tuple[int, bytes]], cuts: list[int], capacity: int
) -> None:
    data = _stream(frames)
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces = [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]
    dec = FrameDecoder(capacity)
    got: list[Frame] = []
    for piece in pieces:
        got.extend(dec.feed(piece))
    assert [(f.phy_offset, bytes(f.body)) for f in got] == frames
    assert dec.buffered == 0


@settings(max_examples=100, deadline=None)
@given(frames=frames_strategy, reads=st.lists(st.integers(1, 1000), min_size=1, max_size=30))
def test_reading_into_the_buffer_decodes_views(frames: list[tuple[int, bytes]], reads: list[int]) -> None:
    """The socket path: recv_into(get_buffer()) of arbitrary sizes, frames drained after every read."""
    data = memoryview(_stream(frames))
    dec = FrameDecoder(400)
    got: list[tuple[int, bytes]] = []
    pos, i = 0, 0
    while pos < len(data):
        room = dec.get_buffer()
        n = min(len(room), reads[i % len(reads)], len(data) - pos)
        room[:n] = data[pos : pos + n]
        dec.buffer_updated(n)
        pos += n
        i += 1
        while (frame := dec.next_frame()) is not None:
            got.append((frame.phy_offset, bytes(frame.body)))
    assert got == frames


def test_heartbeat_frame_has_an_empty_body() -> None:
    (frame,) = FrameDecoder(64).feed(encode_frame_header(4096, 0))
    assert frame.is_heartbeat and frame.phy_offset == 4096


def test_frame_larger_than_the_read_buffer_is_an_error_naming_the_bound() -> None:
    dec = FrameDecoder(100)
    with pytest.raises(HAProtocolError, match="ha_slave_read_buffer_bytes=100"):
        dec.feed(encode_frame_header(0, 100 - FRAME_HEADER_SIZE + 1))


def test_negative_frame_fields_are_errors() -> None:
    with pytest.raises(HAProtocolError, match="phyOffset"):
        FrameDecoder(64).feed(b"\xff" * 8 + b"\x00" * 4)
    with pytest.raises(HAProtocolError, match="bodySize"):
        FrameDecoder(64).feed(b"\x00" * 8 + b"\xff" * 4)


def test_buffer_updated_beyond_free_space_is_refused() -> None:
    dec = FrameDecoder(64)
    with pytest.raises(ValueError, match="free space"):
        dec.buffer_updated(65)


def test_reset_forgets_a_partial_frame() -> None:
    dec = FrameDecoder(64)
    assert dec.feed(encode_frame_header(8, 10) + b"abc") == []
    dec.reset()
    assert dec.feed(encode_frame_header(16, 1) + b"z") == [Frame(16, b"z")]
