"""HA configuration: a frozen, validated attrs object. Defaults are RocketMQ's (docs/BEHAVIOUR.md 2.7); the broker
builds it from its ``.properties`` file (``haSendHeartbeatInterval`` -> ``ha_send_heartbeat_interval_ms``...)."""

from __future__ import annotations

import ssl

import attrs

__all__ = ["HAConfig"]

#: Size of the transfer-frame header, repeated here so validation does not import the protocol module.
_FRAME_HEADER_SIZE = 12


def _positive(_: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value}")


@attrs.frozen(kw_only=True)
class HAConfig:
    """Everything the master/slave replication needs. All times in ms, all sizes in bytes."""

    ha_send_heartbeat_interval_ms: int = attrs.field(default=5000, validator=_positive)
    """``haSendHeartbeatInterval``: idle master sends a heartbeat frame, idle slave re-reports its offset."""
    ha_housekeeping_interval_ms: int = attrs.field(default=20_000, validator=_positive)
    """``haHousekeepingInterval``: either side drops the link after this long without reading a byte."""
    ha_transfer_batch_size: int = attrs.field(default=32 * 1024, validator=_positive)
    """``haTransferBatchSize``: largest body of one transfer frame."""
    ha_transfer_delay_ms: int = attrs.field(default=0)
    """Master: at most this long between an append and its transfer to idle slaves, while fewer than
    ``ha_transfer_batch_size`` bytes are waiting (0: every append is sent at once). Gathers the small appends of
    an ASYNC_MASTER into one frame, one slave wake-up and one report; a SYNC_MASTER needs 0 (its sends wait for
    the ack). The broker sets it from ``haAsyncTransferDelayMs`` on an ASYNC_MASTER only."""
    ha_max_gap_not_in_sync: int = attrs.field(default=256 * 1024 * 1024, validator=_positive)
    """``haMaxGapNotInSync``: a connected slave whose own last ack is this far or further behind a put is not in
    sync (strict ``<``)."""
    in_sync_replicas: int = attrs.field(default=2, validator=_positive)
    """``inSyncReplicas``: copies a SYNC_MASTER send waits for, the master's counted (2 = one slave ack, as
    4.9.3 and decision 5; RocketMQ 5's default 1 means no slave wait). Fewer replicas in sync than that: the
    send answers SLAVE_NOT_AVAILABLE at once."""
    min_in_sync_replicas: int = attrs.field(default=1, validator=_positive)
    """``minInSyncReplicas``: with ``enable_auto_in_sync_replicas``, the fewest copies (master counted) a send
    settles for when fewer than ``in_sync_replicas`` replicas are in sync. Unused otherwise (RocketMQ 5 too)."""
    enable_auto_in_sync_replicas: bool = False
    """``enableAutoInSyncReplicas``: a SYNC_MASTER send waits for ``max(min(in_sync_replicas, replicas in sync),
    min_in_sync_replicas)`` copies instead of ``in_sync_replicas``."""
    reconnect_backoff_min_ms: int = attrs.field(default=100, validator=_positive)
    """First reconnect delay of the slave (doubled per failed attempt, with jitter)."""
    reconnect_backoff_max_ms: int = attrs.field(default=5000, validator=_positive)
    """Largest reconnect delay of the slave (RocketMQ always waits 5000 ms)."""
    ha_connect_timeout_ms: int = attrs.field(default=3000, validator=_positive)
    """Bound on one TCP connect attempt of the slave."""
    ha_slave_read_buffer_bytes: int = attrs.field(default=4 * 1024 * 1024, validator=_positive)
    """Slave read buffer (RocketMQ: 4 MiB); a frame larger than this is a protocol error."""
    ha_send_gather_bytes: int = attrs.field(default=256 * 1024, validator=_positive)
    """Master: body bytes of several frames gathered into one ``sendmsg`` call (fewer syscalls)."""
    ha_max_connections: int = attrs.field(default=64, validator=_positive)
    """Master: reporting slaves at once; a connection whose first report would pass it is closed with a warning."""
    ha_max_pending_connections: int = attrs.field(default=16, validator=_positive)
    """Master: connections that have not reported yet; a newcomer past it replaces the oldest of them."""
    ha_pending_timeout_ms: int = attrs.field(default=3000, validator=_positive)
    """Master: a connection that has not sent its first offset report within this is closed (a real slave
    reports as soon as it connects)."""
    ha_max_ack_waiters: int = attrs.field(default=100_000, validator=_positive)
    """Master: pending ack waits (``wait_for_ack``, ``wait_for_replicas``); beyond this a wait completes False at
    once."""
    ha_max_report_backlog_bytes: int = attrs.field(default=1024 * 1024, validator=_positive)
    """Slave: unsent offset-report bytes tolerated before the link is considered stuck and dropped."""
    ha_stop_timeout_ms: int = attrs.field(default=2000, validator=_positive)
    """Bound on ``stop()`` waiting for its tasks to end."""
    ha_auth_secret: bytes = attrs.field(default=b"", repr=False)
    """``haAuthSecret``: when set, both sides prove they know it (:mod:`broker.peer_auth`) before a byte of the
    log moves; empty: no handshake. Never shown in a repr or a log."""
    advertised_names: tuple[str, ...] = ()
    """Master: the HA addresses it advertises (``brokerIP2:haListenPort``), which a slave's handshake may name
    besides the connection's local address (NAT)."""
    loopback_only: bool = False
    """Protected mode (no ``haAuthSecret``, ``protectedMode`` on): the master closes a connection from a peer that
    is not a loopback address at once, before a byte of the log."""
    ha_auth_timeout_ms: int = attrs.field(default=3000, validator=_positive)
    """Bound on the handshake, on either side (the master's connection is also pending meanwhile, so
    ``ha_pending_timeout_ms`` and ``ha_max_pending_connections`` bound it too)."""
    tls_server: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    """``tlsEnable``: the master's HA port speaks TLS with this context (None: plain TCP). The TLS handshake
    comes first, then the ``ha_auth_secret`` handshake inside it; ``ha_auth_timeout_ms`` bounds each."""
    tls_client: ssl.SSLContext | None = attrs.field(default=None, eq=False, repr=False)
    """``tlsEnable``: the slave connects with this context (verifies the master against ``tlsCaFile``)."""

    def __attrs_post_init__(self) -> None:
        if self.ha_transfer_delay_ms < 0:
            raise ValueError(f"ha_transfer_delay_ms ({self.ha_transfer_delay_ms}) must be >= 0")
        if self.min_in_sync_replicas > self.in_sync_replicas:
            raise ValueError(
                f"min_in_sync_replicas ({self.min_in_sync_replicas}) must be <= "
                f"in_sync_replicas ({self.in_sync_replicas})"
            )
        if self.reconnect_backoff_min_ms > self.reconnect_backoff_max_ms:
            raise ValueError(
                f"reconnect_backoff_min_ms ({self.reconnect_backoff_min_ms}) must be <= "
                f"reconnect_backoff_max_ms ({self.reconnect_backoff_max_ms})"
            )
        if self.ha_slave_read_buffer_bytes < self.ha_transfer_batch_size + _FRAME_HEADER_SIZE:
            raise ValueError(
                f"ha_slave_read_buffer_bytes ({self.ha_slave_read_buffer_bytes}) must hold one frame: "
                f"ha_transfer_batch_size ({self.ha_transfer_batch_size}) + {_FRAME_HEADER_SIZE} header bytes"
            )

    @property
    def tick_ms(self) -> int:
        """Period of the housekeeping / heartbeat checks: fine enough for both intervals, at most 1 s."""
        finest = min(self.ha_send_heartbeat_interval_ms, self.ha_housekeeping_interval_ms)
        return max(5, min(1000, finest // 4))
