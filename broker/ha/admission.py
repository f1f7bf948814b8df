"""Which HA connections a master keeps: a pure rule, so a flood of idle sockets can never lock a real slave out.

A connection is *pending* from its accept until its first valid offset report (a real slave reports at once,
docs/HA.md decision 3). Pending connections have their own small cap and a short deadline; a newcomer past the
cap takes the place of the oldest pending one. Reporting connections are bounded by ``ha_max_connections``: a
pending connection whose first report would pass it is closed. An impostor that does report is a slave as far as
this protocol can tell; telling it from a real one needs authentication (issue 14).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["expired_pending", "pending_to_evict", "report_admitted"]


def pending_to_evict(pending_since_ms: Mapping[int, int], max_pending: int) -> list[int]:
    """Pending connections to close so one more fits: the oldest first, none while below ``max_pending``.

    Args:
        pending_since_ms: accept time of each pending connection, by id.
        max_pending: pending connections allowed at once (at least 1).
    """
    excess = len(pending_since_ms) + 1 - max(1, max_pending)
    if excess <= 0:
        return []
    return [cid for cid, _ in sorted(pending_since_ms.items(), key=lambda kv: (kv[1], kv[0]))[:excess]]


def expired_pending(pending_since_ms: Mapping[int, int], now_ms: int, timeout_ms: int) -> list[int]:
    """Pending connections that have not reported within ``timeout_ms`` of their accept."""
    return [cid for cid, since in pending_since_ms.items() if now_ms - since >= timeout_ms]


def report_admitted(reporting: int, max_connections: int) -> bool:
    """Whether a pending connection's first report may make it one more of ``reporting`` slaves."""
    return reporting < max_connections
