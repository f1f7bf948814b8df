"""The DLedger peer protocol: round trips of every message, any split of the stream, and bad input -- garbage,
truncated frames, absurd sizes, unknown types -- refused with the field named, never a crash or a huge
allocation."""

from __future__ import annotations

import random

import pytest

from broker.dledger.dispatcher import PushKind
from broker.dledger.election import HeartbeatCode, VoteResult
from broker.dledger.entry import write_entry
from broker.dledger.protocol import (
    HEADER,
    FrameDecoder,
    Hello,
    MsgType,
    PeerProtocolError,
    PushCode,
    PushReply,
    Vote,
    decode_heartbeat,
    decode_heartbeat_reply,
    decode_hello,
    decode_push,
    decode_push_reply,
    decode_term,
    decode_vote,
    decode_vote_reply,
    encode_frame,
    encode_frame_parts,
    encode_heartbeat,
    encode_heartbeat_reply,
    encode_hello,
    encode_push_head,
    encode_push_reply,
    encode_term,
    encode_vote,
    encode_vote_reply,
)


def entries(n: int) -> bytes:
    buf = bytearray(n * 60)
    at = 0
    for i in range(n):
        at += write_entry(buf, at, index=i, term=1, pos=at, body=b"e" * 12)
    return bytes(buf[:at])


def stream() -> tuple[bytes, list[tuple[MsgType, int, bytes]]]:
    msgs = [
        (MsgType.HELLO, 0, encode_hello(Hello("g", "n0", "n1"))),
        (MsgType.VOTE, 1, encode_vote(Vote(5, 4, 99, True))),
        (MsgType.VOTE_REPLY, 1, encode_vote_reply(VoteResult.REJECT_TERM_NOT_READY, 6)),
        (MsgType.HEARTBEAT, 2, encode_term(5)),
        (MsgType.HB_REPLY, 2, encode_heartbeat_reply(HeartbeatCode.SUCCESS, 5)),
        (MsgType.PUSH, 3, encode_push_head(PushKind.APPEND, 5, 7, 0, 3) + entries(3)),
        (MsgType.PUSH_REPLY, 3, encode_push_reply(PushReply(PushCode.SUCCESS, 5, 2, 0, 2))),
    ]
    return b"".join(encode_frame(t, r, b) for t, r, b in msgs), msgs


def test_round_trips() -> None:
    data, msgs = stream()
    frames = FrameDecoder(1 << 16).feed(data)
    assert [(f.type, f.request_id, bytes(f.body)) for f in frames] == msgs
    assert decode_hello(frames[0].body) == Hello("g", "n0", "n1")
    assert decode_vote(frames[1].body) == Vote(5, 4, 99, True)
    assert decode_vote_reply(frames[2].body) == (VoteResult.REJECT_TERM_NOT_READY, 6)
    assert decode_term(frames[3].body) == 5
    assert decode_heartbeat_reply(frames[4].body) == (HeartbeatCode.SUCCESS, 5)
    push = decode_push(frames[5].body)
    assert (push.kind, push.term, push.committed_index, push.first_index, push.n_entries) == (PushKind.APPEND, 5, 7, 0, 3)
    assert bytes(push.entries) == entries(3)
    assert decode_push_reply(frames[6].body) == PushReply(PushCode.SUCCESS, 5, 2, 0, 2)


def test_a_push_head_and_its_entries_join_into_one_frame() -> None:
    head = encode_push_head(PushKind.APPEND, 5, 7, 0, 3)
    frame = encode_frame(MsgType.PUSH, 3, head, entries(3))
    assert frame == encode_frame(MsgType.PUSH, 3, head + entries(3))
    (f,) = FrameDecoder(1 << 16).feed(frame)
    assert bytes(decode_push(f.body).entries) == entries(3)


def test_a_frame_in_parts_is_the_joined_frame() -> None:
    head = encode_push_head(PushKind.APPEND, 5, 7, 0, 3)
    first, tail = encode_frame_parts(MsgType.PUSH, 3, head, entries(3))
    assert tail == entries(3)
    assert first + tail == encode_frame(MsgType.PUSH, 3, head, entries(3))


def test_whole_frames_of_a_read_view_it_and_later_reads_change_no_body() -> None:
    """Frames whole in one read are handed over as views of that read's bytes (not copied); a frame that
    straddles reads is copied out of the decoder's buffer. Either way a body handed over stays as it was while
    the decoder takes more bytes (a follower parks a pushed batch until the log reaches it)."""
    data, msgs = stream()
    cut = len(data) - 5  # the last frame straddles the two reads
    dec = FrameDecoder(1 << 16)
    first = dec.feed(data[:cut])
    assert [(f.type, f.request_id, bytes(f.body)) for f in first] == msgs[:-1]
    assert all(f.body.obj is not None and bytes(f.body.obj) == data[:cut] for f in first)
    second = dec.feed(data[cut:] + data)  # then the whole stream again: the buffer is reused
    assert [(f.type, f.request_id, bytes(f.body)) for f in first + second] == msgs + msgs
    assert [bytes(f.body) for f in first] == [b for _, _, b in msgs[:-1]]


@pytest.mark.parametrize("seed", range(5))
def test_any_split(seed: int) -> None:
    data, msgs = stream()
    rng = random.Random(seed)
    dec = FrameDecoder(1 << 16)
    got = []
    at = 0
    while at < len(data):
        n = rng.randint(1, 40)
        got += dec.feed(data[at : at + n])
        at += n
    assert [(f.type, f.request_id, bytes(f.body)) for f in got] == msgs


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", "magic"),
        (HEADER.pack(12, 0x444C, 2, 1, 0), "version 2"),
        (HEADER.pack(12, 0x444C, 1, 99, 0), "type 99 is unknown"),
        (HEADER.pack(11, 0x444C, 1, 1, 0), "length 11 is outside"),
        (HEADER.pack((1 << 31) - 1, 0x444C, 1, 6, 0), "length 2147483647 is outside 12..65536"),
        (HEADER.pack(-5, 0x444C, 1, 6, 0), "length -5"),
    ],
)
def test_bad_frames_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(PeerProtocolError, match=reason):
        FrameDecoder(1 << 16).feed(data)


def test_a_truncated_frame_waits_and_never_allocates_its_claimed_size() -> None:
    dec = FrameDecoder(1 << 16)
    assert dec.feed(encode_frame(MsgType.VOTE, 1, encode_vote(Vote(1, 0, 0, False)))[:-3]) == []


@pytest.mark.parametrize(
    ("decode", "body", "reason"),
    [
        (decode_vote, b"\x00" * 24, "VOTE body is 24 bytes, not 25"),
        (decode_vote, encode_vote(Vote(1, -2, 0, False)), "out of range"),
        (decode_vote, encode_vote(Vote(1, 0, 0, False))[:-1] + b"\x07", "pre_vote 7"),
        (decode_vote_reply, bytes([200]) + b"\x00" * 8, "result 200 is unknown"),
        (decode_heartbeat_reply, bytes([50]) + b"\x00" * 8, "code 50 is unknown"),
        (decode_term, encode_term(-1), "negative"),
        (decode_heartbeat, encode_term(-1), "HEARTBEAT term -1 is negative"),
        (decode_heartbeat, encode_term(1) + b"\x00", "HEARTBEAT body is 9 bytes"),
        (decode_heartbeat, encode_heartbeat(1, "h:1") + b"x", "broker_addr of 3 bytes does not fit the 14-byte"),
        (decode_heartbeat, encode_heartbeat(1, "h:1")[:-1], "broker_addr of 3 bytes does not fit"),
        (decode_heartbeat, encode_term(1) + b"\x00\x02\xff\xfe", "broker_addr is not UTF-8"),
        (decode_push, b"\x00" * 10, "shorter than its 29-byte head"),
        (decode_push, bytes([9]) + b"\x00" * 28, "kind 9 is unknown"),
        (decode_push, encode_push_head(PushKind.COMMIT, 1, 0, 0, 1), "count 1"),
        (decode_push, encode_push_head(PushKind.COMPARE, 1, 0, 0, 2), "count 2"),
        (decode_push, encode_push_head(PushKind.APPEND, 1, 0, 0, 2), "carries 0 entry bytes for 2 entries"),
        (decode_push, encode_push_head(PushKind.APPEND, -1, 0, 0, 1) + entries(1), "term -1"),
        (decode_push_reply, bytes([99]) + b"\x00" * 32, "code 99 is unknown"),
        (decode_hello, b"\x00\x05ab", "group of 5 bytes does not fit"),
        (decode_hello, encode_hello(Hello("g", "a", "b")) + b"x", "1 bytes past its fields"),
        (decode_hello, b"\x00\x01\xff\x00\x00\x00\x00", "group is not UTF-8"),
        (decode_hello, b"\x00\x01g", "ends before its from_id"),
    ],
)
def test_bad_bodies_are_refused(decode, body: bytes, reason: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PeerProtocolError, match=reason):
        decode(body)


def test_random_garbage_never_crashes() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        dec = FrameDecoder(1 << 12)
        try:
            for f in dec.feed(rng.randbytes(rng.randint(0, 80))):
                for decode in (decode_hello, decode_vote, decode_push, decode_push_reply, decode_vote_reply):
                    try:
                        decode(f.body)
                    except PeerProtocolError:
                        pass
        except PeerProtocolError:
            pass


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (encode_heartbeat(7, "127.0.0.1:10911"), (7, "127.0.0.1:10911")),  # a leader names its broker
        (encode_heartbeat(7), (7, "")),  # a member without one sends the bare term
        (encode_term(7), (7, "")),  # as does a member of the previous release
    ],
)
def test_heartbeat_carries_the_leaders_broker_address(body: bytes, expected: tuple[int, str]) -> None:
    assert decode_heartbeat(body) == expected
