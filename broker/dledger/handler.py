"""The follower's side of replication (docs/BEHAVIOUR.md 9.5, DLedger's ``EntryHandler``): the leader's PUSH
requests become writes to this member's log and answers. The rules are :mod:`broker.dledger.follower`'s; this
module reads and writes the log with them.

A PUSH reaches :meth:`EntryHandler.on_push` once the elector has taken it as its leader's word (a push speaks for
its leader as a heartbeat does). Then, by kind:

* COMMIT -- the committed index moves, no further than this follower agrees with the leader;
* COMPARE -- SUCCESS when this log holds the leader's very entry at the index (:func:`compare_answer`);
* TRUNCATE -- the log is made to end with the leader's entry there (the divergent tail goes);
* APPEND -- the batch is parked until the log reaches its first index (several are in flight, in any order), then
  appended entry by entry; the answer waits for that.

Every answer carries this log's begin and end, which the leader's dispatcher steers by.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from broker.dledger.dispatcher import PushKind
from broker.dledger.election import HeartbeatCode
from broker.dledger.entry import read_entry_header
from broker.dledger.follower import Agreement, FollowerCode, ParkedAppends, compare_answer
from broker.dledger.member import MemberState
from broker.dledger.protocol import Push, PushCode, PushReply
from broker.dledger.store import DLedgerStore, EntryRefused

__all__ = ["EntryHandler"]

log = logging.getLogger(__name__)

#: Smallest entry a batch may hold: a header and an empty body (docs/BEHAVIOUR.md 9.6).
_MIN_ENTRY = 48

#: The PUSH answer to a push the elector did not take as its leader's.
_REFUSED = {HeartbeatCode.EXPIRED_TERM: PushCode.EXPIRED_TERM,
            HeartbeatCode.INCONSISTENT_LEADER: PushCode.INCONSISTENT_LEADER}


class EntryHandler:
    """A follower's handling of its leader's pushes.

    Args:
        state: this member (its term; the ledger end is kept in step with the log).
        store: its log.
        clock_ms: wall clock in ms (parked appends time out by it).
        on_commit: ``(committed index, committed position)`` after the committed index moved.
        sweep_interval_ms: how often :meth:`tick` looks at the parked appends, in ms.
    """

    def __init__(self, state: MemberState, store: DLedgerStore, *, clock_ms: Callable[[], int],
                 on_commit: Callable[[int, int], None] | None = None, sweep_interval_ms: int = 1000) -> None:
        self._state = state
        self._store = store
        self._clock = clock_ms
        self._on_commit = on_commit
        self._sweep_interval_ms = sweep_interval_ms
        self._last_sweep_ms = 0
        self._parked = ParkedAppends()
        self._entries: dict[int, bytes | memoryview] = {}  # parked APPEND batches by first index
        self._agreement = Agreement()

    # -- answers --------------------------------------------------------------------------------------------
    def _reply(self, code: PushCode, index: int = -1) -> PushReply:
        s = self._store
        return PushReply(code, self._state.term, index if index >= 0 else s.end_index, s.begin_index, s.end_index)

    def refused(self, code: HeartbeatCode) -> PushReply:
        """The answer to a push the elector did not take as its leader's word (``code`` its heartbeat verdict)."""
        return self._reply(_REFUSED.get(code, PushCode.NOT_FOLLOWER))

    @staticmethod
    def _answer(token: object, reply: PushReply) -> None:
        if isinstance(token, asyncio.Future) and not token.done():
            token.set_result(reply)

    def on_push(self, push: Push) -> PushReply | asyncio.Future[PushReply]:
        """The answer to a push of this member's leader, or the future of it while its entries are parked behind a
        batch that has not arrived."""
        term = self._state.term
        if push.kind is PushKind.COMMIT:
            self._commit_to(push.committed_index)
            return self._reply(PushCode.SUCCESS)
        self._agreement.leader_term(term)
        if push.kind is PushKind.COMPARE:
            self._start_over()
            if compare_answer(self._store.get(push.first_index), push.entries) is not FollowerCode.SUCCESS:
                return self._reply(PushCode.INCONSISTENT_STATE)
            self._agreement.agree(term, push.first_index)
            return self._reply(PushCode.SUCCESS)
        if push.kind is PushKind.TRUNCATE:
            self._start_over()
            return self._truncate(push)
        return self._park(push)

    def _start_over(self) -> None:
        """A COMPARE or TRUNCATE: the leader starts over, so the batches parked here are answered and dropped."""
        for p in self._parked.clear():
            self._entries.pop(p.first_index, None)
            self._answer(p.token, self._reply(PushCode.INCONSISTENT_STATE))

    def _truncate(self, push: Push) -> PushReply:
        try:
            self._store.truncate(bytes(push.entries))
        except (EntryRefused, ValueError) as e:
            log.error("dledger %s: truncate at %d refused: %s", self._state.self_id, push.first_index, e)
            return self._reply(PushCode.INCONSISTENT_STATE)
        self._synced()
        self._agreement.agree(self._state.term, push.first_index)
        self._commit_to(push.committed_index)
        return self._reply(PushCode.SUCCESS)

    def _park(self, push: Push) -> PushReply | asyncio.Future[PushReply]:
        last = push.first_index + push.n_entries - 1
        waiter: asyncio.Future[PushReply] = asyncio.get_running_loop().create_future()
        code = self._parked.park(waiter, push.first_index, last, self._clock())
        if code is not None:
            return self._reply(PushCode.REPEATED_PUSH if code is FollowerCode.REPEATED_PUSH
                               else PushCode.INCONSISTENT_STATE)
        # The transport hands each frame over in a buffer of its own (FrameDecoder.feed: a view of the bytes
        # read, or a copy out of its buffer): parking the view keeps that buffer, not one more copy of the entries.
        self._entries[push.first_index] = push.entries
        self._drain(push.committed_index)
        return waiter.result() if waiter.done() else waiter

    def _drain(self, committed: int) -> None:
        """Append every parked batch that continues the log, in order."""
        store = self._store
        while (p := self._parked.take_next(store.end_index)) is not None:
            data = memoryview(self._entries.pop(p.first_index, b""))
            reply = self._reply(PushCode.SUCCESS, p.last_index)
            at = 0
            try:
                while at < len(data):
                    h = read_entry_header(data, at)
                    if h.size < _MIN_ENTRY or at + h.size > len(data):
                        raise EntryRefused(f"entry at byte {at} of a batch claims {h.size} bytes")
                    if h.entry_index > store.end_index:  # a batch pushed again may start before the end
                        store.append_as_follower(data[at : at + h.size])
                    at += h.size
                self._synced()
                self._agreement.agree(self._state.term, p.last_index)
            except (EntryRefused, OSError) as e:
                log.warning("dledger %s: append from %d refused: %s", self._state.self_id, p.first_index, e)
                reply = self._reply(PushCode.INCONSISTENT_STATE)
            self._answer(p.token, reply)
        self._commit_to(committed)

    def _synced(self) -> None:
        st, store = self._state, self._store
        st.ledger_end_index, st.ledger_end_term = store.end_index, store.end_term

    def _commit_to(self, index: int) -> None:
        st, store = self._state, self._store
        bound = self._agreement.commit_bound(st.term, index, store.end_index)
        if store.update_committed(st.term, bound, st.term) and self._on_commit is not None:
            self._on_commit(store.committed_index, store.committed_pos)

    # -- the state loop -------------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        """The state loop's look, as a follower: once per ``sweep_interval_ms``, answer the parked batches that are
        behind the log and time out the one waiting longest for a gap (:meth:`ParkedAppends.sweep`)."""
        if now_ms - self._last_sweep_ms < self._sweep_interval_ms:
            return
        self._last_sweep_ms = now_ms
        store = self._store
        for p, code in self._parked.sweep(now_ms, store.end_index, lambda p: store.get(p.last_index) is not None):
            self._entries.pop(p.first_index, None)
            self._answer(p.token, self._reply(PushCode.SUCCESS if code is FollowerCode.SUCCESS
                                              else PushCode.INCONSISTENT_STATE, p.last_index))

    @property
    def parked(self) -> int:
        """APPEND batches waiting for the log to reach them."""
        return len(self._parked)
