"""The follower's side of replication (docs/BEHAVIOUR.md 9.5, the rules of DLedger's ``EntryHandler``), as plain
data; :mod:`broker.dledger.handler` does the I/O around them.

* :func:`compare_answer` -- a COMPARE at an index succeeds only when this follower holds the leader's very entry
  there. Holding *an* entry there is not enough: a healed old leader whose log ends at the compared index with an
  entry of its own term would answer SUCCESS, the leader would push from the next index, and every push would be
  refused for ever (the entry after it is placed after the wrong one) -- or, were both the same size, the follower
  would keep a divergent entry under the leader's.
* :class:`Agreement` -- the last index this follower knows agrees with the current leader (a COMPARE, TRUNCATE or
  APPEND proved it); it commits no further (Raft: ``min(leaderCommit, index of last new entry)``).
* :class:`ParkedAppends` -- APPEND requests may arrive out of order (several batches in flight): each is parked by
  its first index until the log reaches it.

COMPARE and TRUNCATE clear the parked appends (the leader is starting over). A parked append that
is already behind the log is answered at once (SUCCESS when the follower holds the same entries), and the
smallest parked append is answered INCONSISTENT_STATE once it has waited ``gap_timeout_ms`` (1 s) without the gap
before it filling: the leader then goes back to COMPARE. Parked appends are bounded (``max_parked``); past it the
request is refused (PUSH_REQUEST_IS_FULL) and the leader pushes it again.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Hashable

import attrs

__all__ = ["Agreement", "FollowerCode", "Parked", "ParkedAppends", "compare_answer"]


class FollowerCode(enum.Enum):
    SUCCESS = "SUCCESS"
    REPEATED_PUSH = "REPEATED_PUSH"
    PUSH_REQUEST_IS_FULL = "PUSH_REQUEST_IS_FULL"
    INCONSISTENT_STATE = "INCONSISTENT_STATE"


def compare_answer(held: bytes | memoryview | None, leaders: bytes | memoryview) -> FollowerCode:
    """The answer to a COMPARE: SUCCESS when ``held`` (this follower's entry at the compared index, None when it has
    none there) is the leader's entry ``leaders`` byte for byte, else INCONSISTENT_STATE.

    The bytes carry the index, term and position (:mod:`broker.dledger.entry`): by Raft's log matching, the same
    index and term mean the same entry and the same log before it, and the same position means the next entry goes
    where the leader's went.
    """
    if held is None or held != leaders:
        return FollowerCode.INCONSISTENT_STATE
    return FollowerCode.SUCCESS


class Agreement:
    """How far this follower's log is known to agree with the leader of a term (-1: nothing proven yet). A new
    leader's term starts from nothing: the previous leader's agreement says nothing about this one's log."""

    def __init__(self) -> None:
        self._term = -1
        self._index = -1

    def leader_term(self, term: int) -> None:
        """A request of the leader of ``term`` arrived (a new term forgets what an older leader proved)."""
        if term != self._term:
            self._term, self._index = term, -1

    def agree(self, term: int, index: int) -> None:
        """The log up to ``index`` is the leader's of ``term`` (an answered COMPARE, TRUNCATE or APPEND)."""
        self.leader_term(term)
        self._index = max(self._index, index)

    def commit_bound(self, term: int, leader_committed: int, end_index: int) -> int:
        """The index this follower may commit in ``term`` when its leader says ``leader_committed``: no further
        than it agrees with that leader, nor than its log's end (-1: none)."""
        agreed = self._index if self._term == term else -1
        return min(leader_committed, agreed, end_index)


@attrs.frozen
class Parked:
    token: Hashable
    first_index: int
    last_index: int
    parked_ms: int


class ParkedAppends:
    """Parked appends of one follower.

    Args:
        max_parked: parked appends at most.
        gap_timeout_ms: how long the smallest parked append waits for the gap before it.
    """

    def __init__(self, *, max_parked: int = 1024, gap_timeout_ms: int = 1000) -> None:
        self._max_parked = max_parked
        self._gap_timeout_ms = gap_timeout_ms
        self._parked: dict[int, Parked] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, token: Hashable, first_index: int, last_index: int, now_ms: int) -> FollowerCode | None:
        """An APPEND of ``first_index .. last_index`` arrived; None when parked (answered later), else the answer
        now."""
        if first_index in self._parked:
            return FollowerCode.REPEATED_PUSH
        if len(self._parked) >= self._max_parked:
            return FollowerCode.PUSH_REQUEST_IS_FULL
        self._parked[first_index] = Parked(token, first_index, last_index, now_ms)
        return None

    def clear(self) -> list[Parked]:
        """A COMPARE or TRUNCATE arrived: drop every parked append (the leader starts over; it times them out)."""
        dropped = list(self._parked.values())
        self._parked.clear()
        return dropped

    def take_next(self, ledger_end: int) -> Parked | None:
        """The parked append that continues the log (it holds index ``ledger_end + 1``: a re-pushed batch may start
        before it), removed; None if absent."""
        p = self._parked.pop(ledger_end + 1, None)
        if p is None:
            for first, q in self._parked.items():
                if first <= ledger_end + 1 <= q.last_index:
                    return self._parked.pop(first)
        return p

    def sweep(self, now_ms: int, ledger_end: int, holds: Callable[[Parked], bool]
              ) -> list[tuple[Parked, FollowerCode]]:
        """The once-a-second check: answer parked appends that are behind the log, and time out the smallest one
        if the gap before it has not filled for ``gap_timeout_ms``.

        Args:
            now_ms: now.
            ledger_end: the follower's last index.
            holds: whether the follower holds the very entries of a parked append that is behind its log.
        """
        out: list[tuple[Parked, FollowerCode]] = []
        for first in sorted(self._parked):
            p = self._parked[first]
            if p.last_index <= ledger_end:
                del self._parked[first]
                out.append((p, FollowerCode.SUCCESS if holds(p) else FollowerCode.INCONSISTENT_STATE))
        if self._parked and ledger_end + 1 not in self._parked:
            first = min(self._parked)
            p = self._parked[first]
            if now_ms - p.parked_ms >= self._gap_timeout_ms:
                del self._parked[first]
                out.append((p, FollowerCode.INCONSISTENT_STATE))
        return out
