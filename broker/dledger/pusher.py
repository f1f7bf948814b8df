"""The leader's replication (docs/BEHAVIOUR.md 9.4-9.5, DLedger's ``DLedgerEntryPusher``): from an append to its
commit, top to bottom in this module.

1. :meth:`EntryPusher.append_nowait` writes the entry to the leader's log, registers it with the quorum tracker
   (the leader's own copy is its first ack) and wakes every follower's push loop;
2. :meth:`EntryPusher._replicate`, one loop per follower, asks that follower's :class:`EntryDispatcher` what to
   send: a COMPARE or TRUNCATE (awaited, one at a time) until the two logs agree, then APPEND batches read once
   for every follower (:class:`PushBuffers`) and written without a task (:meth:`PeerChannel.send`), at most
   ``max_pushes_in_flight`` out at once, and a COMMIT when idle;
3. an APPEND's answer acks the follower's watermark (:meth:`_on_push_answer`) and runs the quorum check
   (:meth:`check_quorum`): the index a majority holds becomes the committed index -- only when the entry there is
   of the leader's own term (Raft's rule, see :mod:`broker.dledger.server`) -- and the appends up to it complete;
   appends past ``maxWaitAckTimeMs`` fail with WAIT_QUORUM_ACK_TIMEOUT, and all of them with TERM_CHANGED when the
   leadership ends.

A follower's answer with a larger term ends the leadership (the elector is told: ``step_down``). The rules are the
pure modules' (:mod:`~broker.dledger.dispatcher`, :mod:`~broker.dledger.quorum`); this module drives them with the
clock, the peers' channels and the log.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.dispatcher import EntryDispatcher, PushKind, PushState
from broker.dledger.member import MemberState, Role
from broker.dledger.protocol import Frame, MsgType, PushCode, PushReply, decode_push_reply, encode_push_head
from broker.dledger.quorum import AckCode, QuorumTracker
from broker.dledger.store import DLedgerStore, copying
from broker.dledger.transport import PeerChannel, PeerError
from broker.dledger.wakeup import Wakeup

__all__ = ["EntryPusher", "PushBuffers"]

log = logging.getLogger(__name__)

#: Bound on a push loop's sleep when nothing woke it, in s: it still re-pushes what timed out and sends COMMITs.
_IDLE_S = 0.05
#: The same while a follower owes a COMMIT (it learns of a newer committed index within this).
_OWES_COMMIT_S = 0.01


class PushBuffers:
    """The entries read for APPEND pushes, kept for the followers pushed the same range: one copy out of the log
    and one buffer on every follower's socket (the transport does not join it into a frame), where each follower
    took its own copy before -- on the leader's one loop, per batch.

    Valid for one leadership: a leader's log only grows (it truncates only as a follower, after its push loops
    stopped), so the entries at an index do not change while it holds them; each leadership makes its own. Holds
    the ``max_ranges`` latest ranges (the followers in step ask for the same one, one after the other).

    Args:
        store: the leader's log.
        max_ranges: ranges kept at most (each at most ``max_bytes`` of a :meth:`get`).
    """

    def __init__(self, store: DLedgerStore, max_ranges: int) -> None:
        self._store = store
        self._recent: collections.deque[tuple[tuple[int, int, int], tuple[bytes, int]]] = collections.deque(
            maxlen=max(1, max_ranges))
        self.reads = 0
        """Ranges read from the log (the others were shared)."""

    def get(self, first: int, last: int, max_bytes: int) -> tuple[bytes, int]:
        """:meth:`DLedgerStore.get_range` of ``first..last``, the very bytes object another follower got for it."""
        key = (first, last, max_bytes)
        for k, v in self._recent:
            if k == key:
                return v
        v = self._store.get_range(first, last, max_bytes)
        self.reads += 1
        if v[1] >= first:
            self._recent.append((key, v))
        return v


class EntryPusher:
    """The leader's appends, pushes and quorum wait.

    Args:
        config: the member's settings (batch and in-flight bounds, ``maxWaitAckTimeMs``, ``maxPendingRequestsNum``).
        state: this member (role and term: a push loop runs while it leads the term it started in).
        store: its log.
        channels: one per other member.
        clock_ms: wall clock in ms.
        step_down: ``(term)`` -- a follower answered with this larger term: the leadership is over.
        on_commit: ``(committed index, committed position)`` after the committed index moved.
    """

    def __init__(self, config: DLedgerConfig, state: MemberState, store: DLedgerStore,
                 channels: Mapping[str, PeerChannel], *, clock_ms: Callable[[], int],
                 step_down: Callable[[int], None], on_commit: Callable[[int, int], None] | None = None) -> None:
        self._config = config
        self._state = state
        self._store = store
        self._channels = channels
        self._clock = clock_ms
        self._step_down = step_down
        self._on_commit = on_commit
        self._new_data = {p: Wakeup() for p in channels}  # one per follower's push loop
        self._tasks: list[asyncio.Task[None]] = []
        self._leading: int | None = None
        """The term this member leads (None: not leading); every push loop checks it, so a cancellation lost in a
        race cannot keep one running."""
        self._tracker: QuorumTracker | None = None
        self._futures: dict[int, tuple[asyncio.Future[tuple[int, int]], int]] = {}  # index -> (waiter, position)
        self.push_buffers: PushBuffers | None = None
        """The entries pushed to the followers in this leadership (None when not leading)."""

    # -- leadership -----------------------------------------------------------------------------------------
    def start(self, term: int) -> None:
        """This member leads ``term`` now: an empty entry of the term first (older entries commit with it, Raft's
        rule), then one push loop per follower. Call it on the member's event loop."""
        cfg = self._config
        self._tracker = QuorumTracker(cfg.peers, max_pending=cfg.max_pending, max_wait_ack_ms=cfg.max_wait_ack_ms)
        index, _ = self._store.append_as_leader(term, b"")
        self._after_local_append(index)
        buffers = self.push_buffers = PushBuffers(self._store, 2 * len(self._channels))
        self._leading = term
        loop = asyncio.get_running_loop()
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks += [loop.create_task(self._replicate(p, term, buffers), name=f"dledger-push-{p}")
                        for p in self._channels]

    def stop(self, code: str = "TERM_CHANGED",
             message: str = "leadership changed before a quorum stored the entry") -> None:
        """The leadership is over: the push loops stop and every append still waiting fails with ``code``."""
        self._leading = None
        for t in self._tasks:
            t.cancel()
        futures, self._futures = self._futures, {}
        for fut, _ in futures.values():
            if not fut.done():
                fut.set_exception(AppendError(code, message, self._state.leader_id))
        self._tracker = None
        self.push_buffers = None

    async def wait_stopped(self) -> None:
        """Until the push loops :meth:`stop` cancelled have ended (a member stopping)."""
        tasks, self._tasks = self._tasks, []
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t

    def kick(self) -> None:
        """New entries or acks: every push loop looks again."""
        for w in self._new_data.values():
            w.set()

    def acked(self, peer: str) -> int:
        """The highest index ``peer`` acknowledged in this leadership (-1: none, or not leading)."""
        if self._tracker is None:
            return -1
        return self._tracker.watermarks(self._state.term).get(peer, -1)

    def progress(self) -> dict[str, int]:
        """Every member's acknowledged index in this leadership (empty when not leading)."""
        if self._tracker is None or self._state.role is not Role.LEADER:
            return {}
        return dict(self._tracker.watermarks(self._state.term))

    # -- appends --------------------------------------------------------------------------------------------
    def _after_local_append(self, index: int) -> None:
        st = self._state
        st.ledger_end_index, st.ledger_end_term = self._store.end_index, self._store.end_term
        assert self._tracker is not None
        self._tracker.ack(st.term, st.self_id, index)
        self.kick()

    async def append(self, body: bytes) -> tuple[int, int]:
        """Append one entry and wait until a quorum stores it; returns ``(index, position)``.

        Raises:
            AppendError: NOT_LEADER, LEADER_PENDING_FULL, WAIT_QUORUM_ACK_TIMEOUT or TERM_CHANGED.
            OSError: the disk refused the write (nothing was appended).
        """
        _, _, fut = self.append_nowait(len(body), copying(body))
        return await fut

    def append_nowait(self, body_length: int, build: Callable[[bytearray, int, int], None]
                      ) -> tuple[int, int, asyncio.Future[tuple[int, int]]]:
        """Append one entry now (its body written by ``build``, see :meth:`DLedgerStore.append_built`) and return
        ``(index, position, future)``; the future completes with ``(index, position)`` once a quorum stores the
        entry, or fails with :class:`AppendError`. Call it on the member's event loop.

        Raises:
            AppendError: NOT_LEADER or LEADER_PENDING_FULL (nothing was appended).
            OSError: the disk refused the write (nothing was appended).
        """
        st, tracker = self._state, self._tracker
        if st.role is not Role.LEADER or tracker is None:
            raise AppendError("NOT_LEADER", f"{st.self_id} is {st.role.value}; the leader is {st.leader_id}",
                              st.leader_id)
        term = st.term
        if tracker.pending_full(term):
            raise AppendError("LEADER_PENDING_FULL", f"more than {self._config.max_pending} appends wait for a "
                                                     f"quorum (maxPendingRequestsNum)", st.leader_id)
        index, pos = self._store.append_built(term, body_length, build)
        fut: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        self._futures[index] = (fut, pos)
        tracker.add(term, index, index, self._clock())
        self._after_local_append(index)
        if not self._channels:
            # A member alone is its own quorum. With others the leader's own entry cannot move the quorum index
            # (its watermark is the highest; a quorum needs a follower's); acks and the state loop's tick check.
            self.check_quorum()
        return index, pos, fut

    # -- one follower ---------------------------------------------------------------------------------------
    async def _replicate(self, peer: str, term: int, buffers: PushBuffers) -> None:
        """The push loop of one follower while this member leads ``term`` (``buffers``: this leadership's)."""
        cfg, st, store = self._config, self._state, self._store
        disp = EntryDispatcher(peer, max_in_flight=cfg.max_in_flight, max_batch=cfg.max_batch_entries,
                               max_push_timeout_ms=cfg.max_push_timeout_ms)
        channel = self._channels[peer]
        inflight: set[asyncio.Future[Any]] = set()
        appends: dict[asyncio.Future[Any], int] = {}  # APPEND pushes out -> sent at ms
        try:
            while self._leading == term and st.role is Role.LEADER and st.term == term:
                now = self._clock()
                if (len(appends) >= cfg.max_pushes_in_flight
                        and now - min(appends.values()) <= cfg.max_push_timeout_ms):
                    # Pushes enough are out: what is appended meanwhile goes in one frame when one comes back.
                    await self._new_data[peer].wait(_OWES_COMMIT_S)
                    continue
                for s in disp.poll(store.begin_index, store.end_index, now, store.committed_index):
                    if s.kind in (PushKind.COMPARE, PushKind.TRUNCATE):
                        await self._compare_or_truncate(channel, disp, s.kind, s.index, term)
                    elif s.kind is PushKind.APPEND:
                        # at most max_batch_bytes, and never past the end of a data file
                        body, last = buffers.get(s.index, s.index + s.count - 1, cfg.max_batch_bytes)
                        if last < s.index + s.count - 1:
                            disp.trim(s.index, last)
                        t = self._send_push(channel, disp, term, s.index, last, body)
                        inflight.add(t)
                        t.add_done_callback(inflight.discard)
                        appends[t] = now
                        t.add_done_callback(appends.pop)
                        if last < s.index + s.count - 1:
                            break  # the trim dropped the later batches of this poll
                    else:
                        t = self._send_push(channel, disp, term, -1, -1, b"")
                        inflight.add(t)
                        t.add_done_callback(inflight.discard)
                owes = disp.owes_commit(store.committed_index)
                await self._new_data[peer].wait(_OWES_COMMIT_S if owes else _IDLE_S)
        finally:
            for t in inflight:
                t.cancel()

    async def _compare_or_truncate(self, channel: PeerChannel, disp: EntryDispatcher, kind: PushKind, index: int,
                                   term: int) -> None:
        store = self._store
        entry = store.get(index)
        if entry is None:
            disp.reset()
            return
        body = encode_push_head(kind, term, store.committed_index, index, 1) + entry
        try:
            f = await channel.request(MsgType.PUSH, body, self._config.request_timeout_s)
            r = decode_push_reply(f.body)
        except (PeerError, ValueError) as e:
            log.debug("dledger %s: %s to %s failed: %s", self._state.self_id, kind.value, channel.peer_id, e)
            disp.reset() if kind is PushKind.TRUNCATE else disp.on_compare_failed()
            await asyncio.sleep(0.5 if isinstance(e, PeerError) else 0)  # back-off: the peer is down or behind
            return
        if self._larger_term(r):
            return
        if r.code not in (PushCode.SUCCESS, PushCode.INCONSISTENT_STATE):
            disp.on_compare_failed() if kind is PushKind.COMPARE else disp.reset()
            await asyncio.sleep(0.05)  # back-off: not following us yet (our first heartbeat is on its way)
            return
        if kind is PushKind.COMPARE:
            disp.on_compare(r.code is PushCode.SUCCESS, r.begin_index, r.end_index, store.begin_index,
                            store.end_index)
        else:
            disp.on_truncate(r.code is PushCode.SUCCESS)
            if r.code is PushCode.SUCCESS and self._tracker is not None:
                self._tracker.ack(term, channel.peer_id, index)
                self.check_quorum()

    def _send_push(self, channel: PeerChannel, disp: EntryDispatcher, term: int, first: int, last: int,
                   entries: bytes) -> asyncio.Future[Any]:
        """Push entries ``first..last`` (none: a COMMIT) to the follower; returns a future done once the answer
        was handled (cancel it to forget the push). Written at once when the channel can
        (:meth:`PeerChannel.send`: no task and no await per push, on the loop every send shares); else (not
        connected yet, or the channel says no) by a task (:meth:`_push`)."""
        kind = PushKind.APPEND if entries else PushKind.COMMIT
        head = encode_push_head(kind, term, self._store.committed_index, first if entries else -1,
                                last - first + 1 if entries else 0)
        fut = channel.send(MsgType.PUSH, head, self._config.request_timeout_s, entries)
        if fut is None:
            return asyncio.get_running_loop().create_task(self._push(channel, disp, term, first, last, entries, head))
        fut.add_done_callback(functools.partial(self._push_answered, channel, disp, term, first, last,
                                                bool(entries)))
        return fut

    def _push_answered(self, channel: PeerChannel, disp: EntryDispatcher, term: int, first: int, last: int,
                       has_entries: bool, fut: asyncio.Future[Frame]) -> None:
        if fut.cancelled() or fut.exception() is not None:
            return  # pushed again after maxPushTimeOutMs
        self._on_push_answer(channel, disp, term, first, last, has_entries, fut.result())

    async def _push(self, channel: PeerChannel, disp: EntryDispatcher, term: int, first: int, last: int,
                    entries: bytes, head: bytes) -> None:
        try:
            f = await channel.request(MsgType.PUSH, head, self._config.request_timeout_s, entries)
        except PeerError:
            return  # pushed again after maxPushTimeOutMs
        self._on_push_answer(channel, disp, term, first, last, bool(entries), f)

    def _on_push_answer(self, channel: PeerChannel, disp: EntryDispatcher, term: int, first: int, last: int,
                        has_entries: bool, f: Frame) -> None:
        try:
            r = decode_push_reply(f.body)
        except ValueError:
            return  # pushed again after maxPushTimeOutMs
        if not has_entries or self._larger_term(r):
            return
        peer = channel.peer_id
        if r.code is PushCode.SUCCESS:
            disp.on_append(True, first, min(last, r.acked_index))
            store = self._store
            committed = store.committed_index
            if self._tracker is not None and self._state.term == term:
                self._tracker.ack(term, peer, min(last, r.acked_index))
                self.check_quorum()
            # The ack frees this follower's window; the others need a look only when the commit moved (they
            # carry it to their followers). A window freed with nothing left to push wakes nobody: the next
            # append does (the second follower's ack of every batch was a loop turn for nothing).
            if store.committed_index != committed:
                self.kick()
            elif disp.state is not PushState.APPEND or disp.write_index <= store.end_index:
                self._new_data[peer].set()
        elif r.code is PushCode.INCONSISTENT_STATE:
            disp.on_append(False, first, last, inconsistent=True)
            self._new_data[peer].set()

    # -- the quorum -----------------------------------------------------------------------------------------
    def check_quorum(self) -> None:
        """Commit what a majority holds (an entry of this term only) and complete or time out the waiting
        appends (on every ack, and on the state loop's tick for the timeouts)."""
        tracker, st, store = self._tracker, self._state, self._store
        if tracker is None or st.role is not Role.LEADER:
            return
        idx, done = tracker.check(st.term, self._clock())
        if idx > store.committed_index:
            unit = store.unit(idx)
            committed = unit is not None and unit[2] == st.term and store.update_committed(st.term, idx, st.term)
            if committed and self._on_commit is not None:
                self._on_commit(store.committed_index, store.committed_pos)
        for c in done:
            entry = self._futures.get(c.index)
            if entry is None:
                continue
            fut, pos = entry
            del self._futures[c.index]
            if fut.done():
                continue
            if c.code is AckCode.SUCCESS:
                fut.set_result((c.index, pos))
            else:
                fut.set_exception(AppendError(c.code.value, f"entry {c.index} was not stored by a quorum within "
                                              f"{self._config.max_wait_ack_ms} ms (maxWaitAckTimeMs)"
                                              if c.code is AckCode.WAIT_QUORUM_ACK_TIMEOUT else
                                              f"the term moved on before entry {c.index} reached a quorum",
                                              st.leader_id))

    def _larger_term(self, r: PushReply) -> bool:
        """A follower answered with a larger term: the leadership is over. True when it did."""
        if r.term > self._state.term:
            self._step_down(r.term)
            return True
        return False
