"""Which HA connections a master keeps: a pure rule, so a flood of idle sockets can never lock a real slave out.

A connection is *pending* from its accept until its first valid offset report (a real slave reports at once,
docs/HA.md decision 3). Pending connections have their own small cap and a short deadline; a newcomer past the
cap takes the place of an older pending one, chosen by source (issue 39): each source address may hold a share
of the cap (:func:`source_share`), a newcomer from a source at its share replaces that source's oldest, and
otherwise the source holding most pending connections gives up its oldest. A flood from one address therefore
only ever evicts itself once it holds its share, and cannot push out the handshake of a slave on another host.
Reporting connections are bounded by ``ha_max_connections``: a pending connection whose first report would pass
it is closed. With ``haAuthSecret`` no connection reports before it passed the handshake (identity), so only
real slaves ever hold the reporting slots; without it, an impostor that reports is a slave as far as this
protocol can tell (protected mode keeps such a port to loopback peers).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

__all__ = ["expired_pending", "is_loopback_peer", "pending_to_evict", "pending_to_evict_by_source", "report_admitted",
           "source_share"]


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


def source_share(max_pending: int) -> int:
    """Pending connections one source address may hold: a quarter of the cap (at least 1). A real slave has one
    connection pending at a time."""
    return max(1, max_pending // 4)


def pending_to_evict_by_source(pending: Mapping[int, tuple[int, str]], newcomer: str, max_pending: int) -> list[int]:
    """Pending connections to close so one more from ``newcomer`` fits (see the module docstring).

    Args:
        pending: ``(accept time ms, source address)`` of each pending connection, by id.
        newcomer: the source address of the connection to admit.
        max_pending: pending connections allowed at once (at least 1).
    """
    by_source: dict[str, list[tuple[int, int]]] = {}
    for cid, (since, source) in pending.items():
        by_source.setdefault(source, []).append((since, cid))
    for conns in by_source.values():
        conns.sort()
    out: list[int] = []
    mine = by_source.get(newcomer, [])
    while mine and len(mine) + 1 > source_share(max_pending):
        out.append(mine.pop(0)[1])
    left = len(pending) - len(out)
    while left + 1 > max(1, max_pending):
        source = max(by_source, key=lambda s: (len(by_source[s]), -by_source[s][0][0] if by_source[s] else 0))
        out.append(by_source[source].pop(0)[1])
        left -= 1
    return out


def is_loopback_peer(host: str) -> bool:
    """Whether a peer address (as ``accept`` reports it) is a loopback address."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False
