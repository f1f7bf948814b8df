"""One DLedger member's state (docs/BEHAVIOUR.md 9.2): role, term, vote, leader and ledger end, with the transitions
the election makes. Pure: the term and vote are handed to an injected ``persist`` callback whenever they change
(the ``currterm`` file is the caller's business), so a member never votes twice in one term across a restart.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import attrs

__all__ = ["MemberState", "Role", "parse_peers"]


class Role(enum.Enum):
    CANDIDATE = "CANDIDATE"
    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"


def parse_peers(text: str) -> dict[str, str]:
    """``"n0-127.0.0.1:40911;n1-127.0.0.1:40912"`` -> ``{"n0": "127.0.0.1:40911", ...}`` (id = text before the
    first ``-``).

    Raises:
        ValueError: an empty or malformed part, or a repeated id (the message quotes it).
    """
    peers: dict[str, str] = {}
    for part in text.split(";"):
        part = part.strip()
        peer_id, sep, addr = part.partition("-")
        host, colon, port = addr.rpartition(":")
        if not sep or not peer_id or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"dLegerPeers part {part!r} is not id-host:port (e.g. n0-127.0.0.1:40911)")
        if peer_id in peers:
            raise ValueError(f"dLegerPeers names peer {peer_id!r} twice")
        peers[peer_id] = addr
    return peers


@attrs.define
class MemberState:
    """What a member knows about itself and its group.

    Args:
        self_id: this member's id (``dLegerSelfId``).
        peers: every member's id -> address, this one included.
        persist: called with ``(term, vote_for)`` whenever either changes, before the change is acted on.
    """

    self_id: str
    peers: Mapping[str, str]
    persist: Callable[[int, str | None], None] = attrs.field(default=lambda term, vote: None, repr=False)
    role: Role = Role.CANDIDATE
    term: int = 0
    """``currTerm``."""
    vote_for: str | None = None
    """``currVoteFor``: whom this member voted for in ``term``."""
    leader_id: str | None = None
    ledger_end_index: int = -1
    ledger_end_term: int = -1
    known_max_term: int = 0
    """``knownMaxTermInGroup``: the largest term heard of."""

    def __attrs_post_init__(self) -> None:
        if self.self_id not in self.peers:
            raise ValueError(f"dLegerSelfId {self.self_id!r} is not one of the peers {sorted(self.peers)}")

    @property
    def peer_count(self) -> int:
        return len(self.peers)

    def is_quorum(self, n: int) -> bool:
        """``n`` members are a majority (3 peers: 2; 2 peers: 2; 5 peers: 3)."""
        return n >= self.peer_count // 2 + 1

    def is_peer(self, peer_id: str) -> bool:
        return peer_id in self.peers

    def restore(self, term: int, vote_for: str | None) -> None:
        """The persisted term and vote, at start."""
        self.term = self.known_max_term = term
        self.vote_for = vote_for

    def _set_term_vote(self, term: int, vote_for: str | None) -> None:
        if (term, vote_for) != (self.term, self.vote_for):
            self.persist(term, vote_for)  # first: a crash right after must not forget a vote already given
            self.term, self.vote_for = term, vote_for

    def next_term(self) -> int:
        """A candidate's next campaign term: the largest term heard of when larger, else ``term + 1``; clears the
        vote.

        Raises:
            RuntimeError: not a candidate.
        """
        if self.role is not Role.CANDIDATE:
            raise RuntimeError(f"next_term needs a candidate, {self.self_id} is {self.role.value}")
        term = self.known_max_term if self.known_max_term > self.term else self.term + 1
        self.known_max_term = max(self.known_max_term, term)
        self._set_term_vote(term, None)
        return term

    def vote(self, candidate_id: str) -> None:
        """Record this member's vote in the current term."""
        self._set_term_vote(self.term, candidate_id)

    def change_to_candidate(self, term: int) -> None:
        """Back to candidate (a term larger than ours was heard of, or the leader went silent).

        Raises:
            ValueError: ``term`` is below the current term.
        """
        if term < self.term:
            raise ValueError(f"change_to_candidate({term}) below the current term {self.term}")
        self.known_max_term = max(self.known_max_term, term)
        self.role = Role.CANDIDATE
        self.leader_id = None

    def change_to_leader(self, term: int) -> None:
        if term != self.term:
            raise ValueError(f"change_to_leader({term}) but the current term is {self.term}")
        self.role = Role.LEADER
        self.leader_id = self.self_id

    def change_to_follower(self, term: int, leader_id: str) -> None:
        if term != self.term:
            raise ValueError(f"change_to_follower({term}) but the current term is {self.term}")
        self.role = Role.FOLLOWER
        self.leader_id = leader_id
