"""TCP options shared by the SDK and the servers: loopback connections use Reno congestion control.

On a machine whose default congestion control is BBR (``net.ipv4.tcp_congestion_control = bbr``, common on
cloud images), a loopback connection can leave BBR's start-up phase. From then on BBR holds the connection to a
congestion window of ten segments and paces what it sends; without the ``fq`` queueing discipline the kernel paces
with a timer. A 64 x 1 KiB ``send_batch`` then goes out in several timed bursts, and each burst wakes the
receiver again. ``python -m benchmarks acl`` measured such a connection at about 20 % more client CPU and 8 % more
broker CPU per message than its twin. It happened in 7 of about 50 runs of two clusters side by side, and it stayed
that way for the connection's life.

A loopback path has no bottleneck queue for pacing to protect, so these connections use Reno, which Linux allows
every user (``tcp_allowed_congestion_control`` always lists it). On a loss-free path Reno only grows its window.
Connections to any other address keep the system's choice. Platforms without ``TCP_CONGESTION`` are left alone.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from typing import Any

__all__ = ["LOOPBACK_CONGESTION_CONTROL", "tune_loopback"]

log = logging.getLogger(__name__)

#: The congestion control of loopback connections.
LOOPBACK_CONGESTION_CONTROL = b"reno"
_TCP_CONGESTION: int | None = getattr(socket, "TCP_CONGESTION", None)


def _is_loopback(peer: Any) -> bool:
    if not isinstance(peer, tuple) or not peer or not isinstance(peer[0], str):
        return False  # a Unix socket, or no peer (not connected)
    try:
        ip = ipaddress.ip_address(peer[0].partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def tune_loopback(sock: Any) -> bool:
    """Give ``sock``, a connected TCP socket (or an event loop's stand-in for one), Reno congestion control when
    its peer is a loopback address; True when it did.

    Never raises: a socket that is closed, not TCP, or refuses the option keeps what it has.
    """
    if _TCP_CONGESTION is None or sock is None:
        return False
    try:
        if not _is_loopback(sock.getpeername()):
            return False
        sock.setsockopt(socket.IPPROTO_TCP, _TCP_CONGESTION, LOOPBACK_CONGESTION_CONTROL)
    except (OSError, AttributeError, TypeError) as e:
        log.debug("loopback congestion control not set: %s", e)
        return False
    return True
