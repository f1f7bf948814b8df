"""The follower's entry handler on its own (:class:`~broker.dledger.handler.EntryHandler`): the leader's pushes
made by hand from a leader's log, into a follower's real log, with an injected clock -- COMPARE against every
kind of follower log, TRUNCATE, APPEND in and out of order, the commit bound, a push refused by the elector, the
once-a-second sweep; and a healed old leader driven by the leader's real dispatcher to the leader's log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.dledger.dispatcher import EntryDispatcher, PushKind, PushState
from broker.dledger.election import HeartbeatCode
from broker.dledger.handler import EntryHandler
from broker.dledger.member import MemberState
from broker.dledger.protocol import Push, PushCode, PushReply
from broker.dledger.store import DLedgerStore
from broker.store.io import FileIO

PEERS = {"n0": "x:1", "n1": "x:2", "n2": "x:3"}
TERM = 2
#: The leader's log: two entries of term 1, its empty entry of term 2, one entry of term 2.
LEADER = [(1, b"a"), (1, b"b"), (2, b""), (2, b"m")]


def log(root: Path, name: str, entries: list[tuple[int, bytes]]) -> DLedgerStore:
    s = DLedgerStore(FileIO(), str(root / f"dledger-{name}"), data_file_size=1 << 16, index_file_size=32 * 64)
    s.load()
    for term, body in entries:
        s.append_as_leader(term, body)
    return s


class Follower:
    """``n1`` following ``n0`` in ``TERM`` with the entries given, and the leader's log beside it."""

    def __init__(self, root: Path, entries: list[tuple[int, bytes]]) -> None:
        self.now = 10_000
        self.leader = log(root, "n0", LEADER)
        self.store = log(root, "n1", entries)
        self.state = MemberState("n1", PEERS)
        self.state.restore(TERM, None)
        self.state.change_to_follower(TERM, "n0")
        self.commits: list[int] = []
        self.handler = EntryHandler(self.state, self.store, clock_ms=lambda: self.now,
                                    on_commit=lambda index, _pos: self.commits.append(index))

    def push(self, kind: PushKind, first: int, count: int = 1, committed: int = -1
             ) -> PushReply | asyncio.Future[PushReply]:
        entries = b"".join(self.leader.get(i) or b"" for i in range(first, first + count))
        return self.handler.on_push(Push(kind, TERM, committed, first, count, entries))

    def reply(self, kind: PushKind, first: int, count: int = 1, committed: int = -1) -> PushReply:
        r = self.push(kind, first, count, committed)
        assert isinstance(r, PushReply), r
        return r

    def entries(self) -> list[bytes | None]:
        return [self.store.get(i) for i in range(self.store.end_index + 1)]

    def close(self) -> None:
        self.leader.close()
        self.store.close()


@pytest.mark.parametrize(("entries", "index", "code"), [
    pytest.param(LEADER[:2], 1, PushCode.SUCCESS, id="the same entry"),
    pytest.param(LEADER, 3, PushCode.SUCCESS, id="the same log"),
    pytest.param([*LEADER[:2], (1, b"lost")], 2, PushCode.INCONSISTENT_STATE,
                 id="an old leader ending at the index with its own entry"),
    pytest.param([*LEADER[:2], (1, b"")], 2, PushCode.INCONSISTENT_STATE,
                 id="an entry of another term and the same size"),
    pytest.param(LEADER[:2], 2, PushCode.INCONSISTENT_STATE, id="a log that does not reach the index"),
    pytest.param([], 0, PushCode.INCONSISTENT_STATE, id="an empty log"),
])
def test_compare_answers_success_only_for_the_leaders_very_entry(
        tmp_path: Path, entries: list[tuple[int, bytes]], index: int, code: PushCode) -> None:
    f = Follower(tmp_path, entries)
    try:
        r = f.reply(PushKind.COMPARE, index)
        assert (r.code, r.term, r.begin_index, r.end_index) == (code, TERM, 0 if entries else -1, len(entries) - 1)
    finally:
        f.close()


def test_a_healed_old_leader_whose_log_ends_at_the_compared_index_gets_the_leaders_log(tmp_path: Path) -> None:
    """The old leader's log ends exactly where the new leader compares, with an entry of its own term: the
    leader's dispatcher, answered by the handler, walks back one, truncates there and appends the rest. A COMPARE
    that answered SUCCESS for any entry there would have the leader push from the next index, every push refused
    ("append from 3 refused": its entry 3 would sit after a different entry 2) for ever."""
    f = Follower(tmp_path, [*LEADER[:2], (1, b"lost")])
    d = EntryDispatcher("n1")
    end = f.leader.end_index

    async def main() -> None:
        for now in range(20):
            for s in d.poll(0, end, now):
                if s.kind in (PushKind.COMPARE, PushKind.TRUNCATE):
                    r = f.reply(s.kind, s.index)
                    if s.kind is PushKind.COMPARE:
                        d.on_compare(r.code is PushCode.SUCCESS, r.begin_index, r.end_index, 0, end)
                    else:
                        d.on_truncate(r.code is PushCode.SUCCESS)
                elif s.kind is PushKind.APPEND:
                    answer = f.push(PushKind.APPEND, s.index, s.count)
                    r = answer if isinstance(answer, PushReply) else await answer
                    d.on_append(r.code is PushCode.SUCCESS, s.index, r.acked_index,
                                inconsistent=r.code is PushCode.INCONSISTENT_STATE)
            if d.state is PushState.APPEND and d.watermark == end:
                return

    try:
        asyncio.run(main())
        assert f.entries() == [f.leader.get(i) for i in range(end + 1)]
    finally:
        f.close()


def test_truncate_ends_the_log_with_the_leaders_entry_and_commits_no_further(tmp_path: Path) -> None:
    f = Follower(tmp_path, [*LEADER[:2], (1, b"lost"), (1, b"more")])
    try:
        r = f.reply(PushKind.TRUNCATE, 2, committed=3)
        assert (r.code, r.end_index) == (PushCode.SUCCESS, 2)
        assert f.entries() == [f.leader.get(i) for i in range(3)]
        assert (f.state.ledger_end_index, f.state.ledger_end_term) == (2, TERM)
        assert f.store.committed_index == 2 and f.commits == [2]  # agreed up to 2, not the leader's 3
    finally:
        f.close()


def test_appends_out_of_order_wait_for_the_gap_and_commit_up_to_what_agrees(tmp_path: Path) -> None:
    f = Follower(tmp_path, LEADER[:2])

    async def main() -> None:
        assert f.reply(PushKind.COMMIT, -1, 0, committed=1).code is PushCode.SUCCESS
        assert f.store.committed_index == -1  # nothing proven to agree with this leader yet
        later = f.push(PushKind.APPEND, 3, committed=3)
        assert isinstance(later, asyncio.Future) and not later.done() and f.handler.parked == 1
        r = f.reply(PushKind.APPEND, 2, committed=3)  # fills the gap: both go in
        assert (r.code, r.acked_index) == (PushCode.SUCCESS, 2)
        assert (await later).acked_index == 3 and f.handler.parked == 0
        assert f.entries() == [f.leader.get(i) for i in range(4)]
        assert f.store.committed_index == 3 and f.commits == [3]
        again = f.push(PushKind.APPEND, 3)  # pushed again, wholly behind the log: the sweep answers it
        f.handler.tick(f.now)
        assert isinstance(again, asyncio.Future) and (await again).code is PushCode.SUCCESS

    try:
        asyncio.run(main())
    finally:
        f.close()


def test_an_entry_that_does_not_continue_the_log_is_refused_and_the_leader_told(tmp_path: Path) -> None:
    f = Follower(tmp_path, [*LEADER[:2], (1, b"lost")])

    async def main() -> None:
        r = f.reply(PushKind.APPEND, 3)  # entry 3 is placed after the leader's entry 2, not this one
        assert (r.code, f.store.end_index) == (PushCode.INCONSISTENT_STATE, 2)

    try:
        asyncio.run(main())
    finally:
        f.close()


def test_compare_and_truncate_answer_the_parked_appends_and_the_sweep_times_out_a_gap(tmp_path: Path) -> None:
    f = Follower(tmp_path, LEADER[:2])

    async def main() -> None:
        dropped = f.push(PushKind.APPEND, 3)
        assert f.reply(PushKind.COMPARE, 1).code is PushCode.SUCCESS
        assert isinstance(dropped, asyncio.Future) and (await dropped).code is PushCode.INCONSISTENT_STATE
        gap = f.push(PushKind.APPEND, 3)
        f.handler.tick(f.now)  # the sweep looks now, with the gap 0 ms old
        f.now += 999
        f.handler.tick(f.now)  # not a second later: no look
        assert isinstance(gap, asyncio.Future) and not gap.done()
        f.now += 1001
        f.handler.tick(f.now)
        assert (await gap).code is PushCode.INCONSISTENT_STATE  # the leader goes back to COMPARE

    try:
        asyncio.run(main())
    finally:
        f.close()


@pytest.mark.parametrize(("code", "push_code"), [
    (HeartbeatCode.EXPIRED_TERM, PushCode.EXPIRED_TERM),
    (HeartbeatCode.INCONSISTENT_LEADER, PushCode.INCONSISTENT_LEADER),
    (HeartbeatCode.TERM_NOT_READY, PushCode.NOT_FOLLOWER),
    (HeartbeatCode.UNKNOWN_MEMBER, PushCode.NOT_FOLLOWER),
])
def test_a_push_the_elector_refused_is_answered_with_its_reason(tmp_path: Path, code: HeartbeatCode,
                                                                 push_code: PushCode) -> None:
    f = Follower(tmp_path, LEADER[:2])
    try:
        r = f.handler.refused(code)
        assert (r.code, r.term, r.end_index) == (push_code, TERM, 1)
    finally:
        f.close()
