"""The leader's replication to one follower (docs/BEHAVIOUR.md 9.5, DLedger's ``EntryDispatcher``), as a pure state
machine: it says what to send next, and learns from each answer. The transport sends; the store provides entries.

States:

* COMPARE -- find the last entry both logs share: ask about the leader's last entry, then walk back (to the
  follower's end when it is shorter, one by one on a mismatch); when the follower's log has no overlap with the
  leader's, or the walk passes the leader's first entry, TRUNCATE at the leader's first entry;
* TRUNCATE -- make the follower's log end at an entry the leader sends (its divergent tail goes); then APPEND;
* APPEND -- push entries in batches from the follower's watermark on, at most ``max_in_flight`` entries
  unacknowledged; an ack moves the watermark; INCONSISTENT_STATE (the follower lost track: a gap) goes back to
  COMPARE; the batch after the watermark is pushed again once it has waited ``max_push_timeout_ms``; when caught
  up and idle for ``commit_idle_ms`` a COMMIT carries the committed index (pushes carry it otherwise).

Any failure of a COMPARE or TRUNCATE (timeout, error) goes back to COMPARE, as does a change of term or leader
(:meth:`EntryDispatcher.reset`).
"""

from __future__ import annotations

import enum

import attrs

__all__ = ["EntryDispatcher", "PushKind", "PushState", "Send"]


class PushState(enum.Enum):
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"
    APPEND = "APPEND"


class PushKind(enum.Enum):
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"
    APPEND = "APPEND"
    COMMIT = "COMMIT"


@attrs.frozen
class Send:
    """A request to send: ``kind`` at ``index`` (APPEND: entries ``index .. index + count - 1``)."""

    kind: PushKind
    index: int
    count: int = 1


class EntryDispatcher:
    """One follower's replication state.

    Args:
        peer_id: the follower (for messages).
        max_in_flight: entries pushed and not acknowledged at most.
        max_batch: entries per APPEND at most.
        max_push_timeout_ms: ``maxPushTimeOutMs``, before the batch after the watermark is pushed again.
        commit_idle_ms: idle time after which a caught-up follower gets a COMMIT.
        commit_gap_ms: a caught-up follower learns of a newer committed index by a COMMIT at most this often
            (so it serves reads of what was acknowledged within milliseconds, not at the next idle COMMIT).
    """

    def __init__(self, peer_id: str, *, max_in_flight: int = 1000, max_batch: int = 64,
                 max_push_timeout_ms: int = 1000, commit_idle_ms: int = 1000, commit_gap_ms: int = 10) -> None:
        self.peer_id = peer_id
        self._max_in_flight = max_in_flight
        self._max_batch = max_batch
        self._push_timeout_ms = max_push_timeout_ms
        self._commit_idle_ms = commit_idle_ms
        self._commit_gap_ms = commit_gap_ms
        self._commit_told = -1  # the committed index the last push carried
        self.state = PushState.COMPARE
        self.compare_index = -1
        self.truncate_index = -1
        self.watermark = -1
        """Highest index the follower acknowledged in this state's run."""
        self.write_index = 0
        """Next index to push."""
        self._in_flight: dict[int, tuple[int, int]] = {}  # first index -> (last index, sent at ms)
        self._waiting = False  # a COMPARE or TRUNCATE is out
        self._last_send_ms = 0

    def reset(self) -> None:
        """Back to COMPARE (a new term or leader, an error)."""
        self.state = PushState.COMPARE
        self.compare_index = self.truncate_index = -1
        self._in_flight.clear()
        self._waiting = False

    def _append_from(self, index: int) -> None:
        self.state = PushState.APPEND
        self.watermark = index
        self.write_index = index + 1
        self._in_flight.clear()
        self._waiting = False

    # -- what to send ---------------------------------------------------------------------------------------
    def poll(self, leader_begin: int, leader_end: int, now_ms: int, committed_index: int = -1) -> list[Send]:
        """What to send now, given the leader's log ``[leader_begin, leader_end]`` (-1, -1 when empty) and its
        committed index."""
        if self.state is PushState.COMPARE:
            if self._waiting:
                return []
            if leader_end < 0:  # an empty leader has nothing to compare: the follower gets everything from 0
                self._append_from(-1)
                return self.poll(leader_begin, leader_end, now_ms, committed_index)
            if self.compare_index < 0 or self.compare_index > leader_end:
                self.compare_index = leader_end
            self._waiting = True
            return [Send(PushKind.COMPARE, self.compare_index)]
        if self.state is PushState.TRUNCATE:
            if self._waiting:
                return []
            self._waiting = True
            return [Send(PushKind.TRUNCATE, self.truncate_index)]
        return self._poll_append(leader_end, now_ms, committed_index)

    def _poll_append(self, leader_end: int, now_ms: int, committed_index: int) -> list[Send]:
        out: list[Send] = []
        head = self._in_flight.get(self.watermark + 1)
        if head is not None and now_ms - head[1] > self._push_timeout_ms:
            last = head[0]
            self._in_flight[self.watermark + 1] = (last, now_ms)  # pushed again, the same entries
            out.append(Send(PushKind.APPEND, self.watermark + 1, last - self.watermark))
        while self.write_index <= leader_end and self.write_index - self.watermark - 1 < self._max_in_flight:
            room = self._max_in_flight - (self.write_index - self.watermark - 1)
            n = min(self._max_batch, leader_end - self.write_index + 1, room)
            self._in_flight[self.write_index] = (self.write_index + n - 1, now_ms)
            out.append(Send(PushKind.APPEND, self.write_index, n))
            self.write_index += n
        if out:
            self._last_send_ms = now_ms
            self._commit_told = committed_index
        elif self.write_index > leader_end and (
                now_ms - self._last_send_ms > self._commit_idle_ms
                or (committed_index > self._commit_told and now_ms - self._last_send_ms >= self._commit_gap_ms)):
            self._last_send_ms = now_ms
            self._commit_told = committed_index
            out.append(Send(PushKind.COMMIT, self.watermark))
        return out

    def owes_commit(self, committed_index: int) -> bool:
        """The follower has not been told of ``committed_index`` yet (a COMMIT is due within the gap)."""
        return self.state is PushState.APPEND and committed_index > self._commit_told

    def trim(self, first_index: int, last_index: int) -> None:
        """The APPEND planned from ``first_index`` carries entries only up to ``last_index`` (a byte bound): the
        batches planned after it are dropped and pushing goes on from ``last_index + 1`` (the caller sends none
        of the later APPENDs of the same poll)."""
        planned = self._in_flight.get(first_index)
        if planned is None or not first_index <= last_index < planned[0]:
            return
        self._in_flight[first_index] = (last_index, planned[1])
        for f in [f for f in self._in_flight if f > first_index]:
            del self._in_flight[f]
        self.write_index = last_index + 1

    # -- what came back -------------------------------------------------------------------------------------
    def on_compare(self, success: bool, follower_begin: int, follower_end: int, leader_begin: int,
                   leader_end: int) -> None:
        """The answer to COMPARE at :attr:`compare_index`: ``success`` when the follower holds the same entry
        there; its log spans ``[follower_begin, follower_end]``."""
        self._waiting = False
        ci = self.compare_index
        truncate = -1
        if success:
            if ci == follower_end:
                self._append_from(ci)
                return
            truncate = ci  # the same entry, and the follower has more after it: cut its tail there
        elif follower_end < leader_begin or follower_begin > leader_end or ci < follower_begin:
            truncate = leader_begin
        elif ci > follower_end:
            self.compare_index = follower_end
        else:
            self.compare_index = ci - 1
        if self.compare_index < leader_begin:
            truncate = leader_begin
        if truncate >= 0:
            self.state = PushState.TRUNCATE
            self.truncate_index = truncate

    def on_compare_failed(self) -> None:
        """COMPARE timed out or failed: ask again."""
        self._waiting = False

    def on_truncate(self, success: bool) -> None:
        """The answer to TRUNCATE at :attr:`truncate_index`."""
        self._waiting = False
        if success:
            self._append_from(self.truncate_index)
        else:
            self.reset()

    def on_append(self, success: bool, first_index: int, last_index: int, *, inconsistent: bool = False) -> int:
        """The answer to an APPEND of ``first_index .. last_index``; returns the watermark.

        Args:
            success: the follower appended them (or already had them).
            inconsistent: the follower answered INCONSISTENT_STATE (a gap it could not fill): back to COMPARE.
        """
        if self.state is not PushState.APPEND:
            return self.watermark  # an answer from before a reset
        if inconsistent:
            self.reset()
            return self.watermark
        if success:
            for first in [f for f, (last, _) in self._in_flight.items() if last <= last_index]:
                del self._in_flight[first]
            self.watermark = max(self.watermark, last_index)
        return self.watermark
