"""The leader's wait for a quorum (docs/BEHAVIOUR.md 9.4-9.5, DLedger's ``pendingAppendResponsesByTerm``,
``peerWaterMarksByTerm`` and ``QuorumAckChecker``), as plain data: no futures, no threads. An append registers an
opaque token; :meth:`QuorumTracker.check` says which tokens complete, and how. The caller owns the real futures.

* the quorum index is the watermark a majority has reached: watermarks sorted high to low, the one at
  ``peer_count // 2`` (3 peers ``{10, 8, 5}`` -> 8; 2 peers ``{10, 5}`` -> 5; 5 peers ``{10, 9, 8, 7, 6}`` -> 8);
* appends at or below it complete with SUCCESS; past their deadline (``maxWaitAckTimeMs``) and still above it, with
  WAIT_QUORUM_ACK_TIMEOUT -- they stay counted, so a leader cut off from its followers soon answers
  LEADER_PENDING_FULL (more than ``maxPendingRequestsNum`` waiting) without writing;
* appends of an older term complete with TERM_CHANGED when the term moves on.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Iterable, Sequence

import attrs

__all__ = ["AckCode", "Completion", "QuorumTracker", "quorum_index"]


class AckCode(enum.Enum):
    SUCCESS = "SUCCESS"
    WAIT_QUORUM_ACK_TIMEOUT = "WAIT_QUORUM_ACK_TIMEOUT"
    TERM_CHANGED = "TERM_CHANGED"


def quorum_index(watermarks: Sequence[int]) -> int:
    """The highest index a majority of ``watermarks`` (one per peer, the leader's included) has reached."""
    if not watermarks:
        raise ValueError("no watermarks")
    return sorted(watermarks, reverse=True)[len(watermarks) // 2]


@attrs.frozen
class Completion:
    token: Hashable
    index: int
    code: AckCode


@attrs.define
class _Pending:
    token: Hashable
    deadline_ms: int
    timed_out: bool = False


class QuorumTracker:
    """Pending appends and peer watermarks, per term.

    Args:
        peer_ids: every member, the leader included.
        max_pending: ``maxPendingRequestsNum``.
        max_wait_ack_ms: ``maxWaitAckTimeMs``.
    """

    def __init__(self, peer_ids: Iterable[str], *, max_pending: int = 10_000, max_wait_ack_ms: int = 2500) -> None:
        self._peers = tuple(peer_ids)
        self._max_pending = max_pending
        self._max_wait_ack_ms = max_wait_ack_ms
        self._watermarks: dict[int, dict[str, int]] = {}
        self._pending: dict[int, dict[int, _Pending]] = {}
        self._quorum_index: dict[int, int] = {}

    def watermarks(self, term: int) -> dict[str, int]:
        """``peer -> highest index acked`` in ``term`` (-1 until it acks)."""
        marks = self._watermarks.get(term)
        if marks is None:  # made once per term (this runs on every ack)
            marks = self._watermarks[term] = dict.fromkeys(self._peers, -1)
        return marks

    def pending_count(self, term: int) -> int:
        return len(self._pending.get(term, ()))

    def pending_full(self, term: int) -> bool:
        """More than ``maxPendingRequestsNum`` appends wait in ``term``: the next one is refused at once."""
        return self.pending_count(term) > self._max_pending

    def add(self, term: int, index: int, token: Hashable, now_ms: int) -> None:
        """An append of ``index`` in ``term`` waits for a quorum.

        Raises:
            ValueError: ``index`` already waits in ``term``.
        """
        pending = self._pending.setdefault(term, {})
        if index in pending:
            raise ValueError(f"index {index} already waits for a quorum in term {term}")
        pending[index] = _Pending(token, now_ms + self._max_wait_ack_ms)

    def ack(self, term: int, peer_id: str, index: int) -> None:
        """``peer_id`` holds every entry up to ``index`` (watermarks never go down)."""
        marks = self.watermarks(term)
        if peer_id not in marks:
            raise ValueError(f"unknown peer {peer_id!r}")
        if index > marks[peer_id]:
            marks[peer_id] = index

    def quorum_index(self, term: int) -> int:
        return quorum_index(list(self.watermarks(term).values()))

    def check(self, term: int, now_ms: int) -> tuple[int, list[Completion]]:
        """One pass of the quorum checker in the leader's current ``term``.

        Returns:
            ``(quorum index, completions)``: the index to commit, and the appends that complete now.
        """
        done: list[Completion] = []
        # Runs on every ack: the scans for older terms only when there is one (a map of another term).
        if len(self._pending) > 1 or (self._pending and term not in self._pending):
            for old in [t for t in self._pending if t < term]:
                done.extend(Completion(p.token, i, AckCode.TERM_CHANGED)
                            for i, p in sorted(self._pending.pop(old).items()) if not p.timed_out)
        if len(self._watermarks) > 1 or (self._watermarks and term not in self._watermarks):
            for old in [t for t in self._watermarks if t < term]:
                del self._watermarks[old]
        q = self.quorum_index(term)
        pending = self._pending.get(term, {})
        for i in sorted(i for i in pending if i <= q):
            p = pending.pop(i)
            if not p.timed_out:
                done.append(Completion(p.token, i, AckCode.SUCCESS))
        if not done:
            # Nothing reached a quorum: expire the oldest waiters, in index order, up to the first still in time.
            for i in sorted(pending):
                p = pending[i]
                if p.timed_out:
                    continue
                if p.deadline_ms > now_ms:
                    break
                p.timed_out = True  # still counted against maxPendingRequestsNum until a quorum passes it
                done.append(Completion(p.token, i, AckCode.WAIT_QUORUM_ACK_TIMEOUT))
        return q, done
