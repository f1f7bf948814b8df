"""A DLedger member's settings and the error its appends fail with: what the broker, the server and each role
share, and nothing else (no role imports another's module for these).

* :class:`DLedgerConfig` -- the ``dLeger*`` keys a member runs with (docs/BEHAVIOUR.md 9.1), frozen;
* :class:`AppendError` -- an append that did not commit, with DLedger's code and the leader this member knows.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping

import attrs

from broker.dledger.election import ElectionTimings

__all__ = ["AppendError", "DLedgerConfig"]


@attrs.frozen(kw_only=True)
class DLedgerConfig:
    """A member's settings (docs/BEHAVIOUR.md 9.1; the broker builds it from its ``dLeger*`` keys)."""

    group: str
    self_id: str
    peers: Mapping[str, str]
    """Every member's id -> ``host:port`` of its peer port, this one included."""
    timings: ElectionTimings = attrs.field(factory=ElectionTimings)
    pre_vote: bool = True
    max_pending: int = 10_000
    """``maxPendingRequestsNum``: appends waiting for a quorum at most."""
    max_wait_ack_ms: int = 2500
    """``maxWaitAckTimeMs``: how long an append waits for a quorum, in ms."""
    max_push_timeout_ms: int = 1000
    """``maxPushTimeOutMs``: an APPEND unanswered this long (ms) is pushed again."""
    max_batch_entries: int = 64
    """Entries in one APPEND at most."""
    max_batch_bytes: int = 4 << 20
    """Bytes of entries in one APPEND at most."""
    max_in_flight: int = 1000
    """Entries pushed to one follower and not acknowledged at most."""
    max_pushes_in_flight: int = 2
    """APPEND requests out to one follower at once at most: entries appended while they are out wait for the next
    push and go in one frame (with several senders, fewer and larger pushes cost the leader and the follower less
    per entry; a lone sender finds no push out and is pushed at once). A push out longer than
    ``max_push_timeout_ms`` does not hold the next one back."""
    request_timeout_s: float = 3.0
    """Bound on one request to a peer (a vote, a COMPARE, a TRUNCATE, an APPEND), in seconds."""
    preferred_leader_id: str | None = None
    """``preferredLeaderIds``: a leader hands leadership to this member once it has every entry."""
    auth_secret: bytes = attrs.field(default=b"", repr=False)
    """``haAuthSecret``: every peer connection passes the handshake of :mod:`broker.peer_auth` first, both ways
    ('' = none)."""
    loopback_only: bool = False
    """Protected mode (no ``haAuthSecret``, ``protectedMode`` on): the peer port closes a connection from a peer
    that is not a loopback address at once."""
    broker_addr: str = ""
    """The member's broker (HTTP) address, sent with its heartbeats as leader: its followers' master address
    ('' = none sent)."""
    tls_server: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    """``tlsEnable``: the peer port accepts TLS only, with this context (None: plain TCP)."""
    tls_client: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    """``tlsEnable``: connections to the other members use TLS with this context (verifies them)."""

    @property
    def others(self) -> list[str]:
        """The other members' ids, in ``peers`` order."""
        return [p for p in self.peers if p != self.self_id]


class AppendError(Exception):
    """An append that did not commit: ``code`` is NOT_LEADER, LEADER_TRANSFERRING, LEADER_PENDING_FULL,
    WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED or (a leadership transfer) TRANSFER_FAILED; ``leader_id`` the leader this
    member knows (None when none)."""

    def __init__(self, code: str, message: str, leader_id: str | None = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.leader_id = leader_id
