"""Broker configuration: RocketMQ's camelCase ``.properties`` keys -> a frozen, validated :class:`BrokerConfig`.

Loading (docs/BEHAVIOUR.md 1.2, with the decisions at its top): read the file, apply ``--set key=value`` overrides,
convert each known key strictly (a bad value is a :class:`ConfigError` naming the key and the value, where
RocketMQ silently keeps the default), then derive: masters get ``brokerId=0``; a slave needs ``brokerId > 0``;
``haListenPort`` is the configured one when > 0, else ``listenPort + 1`` (0 when ``listenPort`` is 0, so the OS
chooses both). Unknown keys are reported back to the caller, who logs one warning naming them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from broker.ha.config import HAConfig
from broker.properties_file import PropertiesSyntaxError, parse_properties
from broker.store.config import DEFAULT_DELAY_LEVELS, StoreConfig, parse_delay_levels
from broker.store.retention import RetentionConfig, parse_delete_when
from common.codes import BrokerRole, FlushDiskType, Perm
from common.tls import TlsConfigError, client_context, server_context

__all__ = ["SLAVE_TRANSFER_DEFAULTS", "BrokerConfig", "BrokerTls", "ConfigError", "LoadedConfig", "load_config",
           "parse_set_options"]


class ConfigError(ValueError):
    """A configuration value is wrong; the message names the key and the value."""


def _default_broker_name() -> str:
    return socket.gethostname() or "DEFAULT_BROKER"


@attrs.frozen(kw_only=True)
class BrokerConfig:
    """One broker's configuration. Field names are RocketMQ's keys in snake_case, units last."""

    broker_cluster_name: str = "DefaultCluster"
    """``brokerClusterName``."""
    broker_name: str = attrs.field(factory=_default_broker_name)
    """``brokerName``: the broker group; master and slaves share it."""
    broker_id: int = 0
    """``brokerId``: 0 = master, > 0 = slave."""
    broker_role: BrokerRole = BrokerRole.ASYNC_MASTER
    """``brokerRole``."""
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    """``flushDiskType``."""
    namesrv_addr: tuple[str, ...] = ()
    """``namesrvAddr`` split on ``;``."""
    broker_ip1: str = "127.0.0.1"
    """``brokerIP1``: host of the registered client address."""
    broker_ip2: str = ""
    """``brokerIP2``: host of the registered HA address ('' = brokerIP1)."""
    bind_address: str = ""
    """``bindAddress`` (SplitMQ): interface the HTTP and HA sockets bind ('' = brokerIP1)."""
    listen_port: int = 10911
    """``listenPort``; 0 lets the OS choose."""
    ha_listen_port: int = 10912
    """``haListenPort`` after derivation; 0 lets the OS choose."""
    ha_master_address: str | None = None
    """``haMasterAddress``: a slave's fixed master HA address (never updated from the nameserver)."""
    store_path_root_dir: str = "~/store"
    """``storePathRootDir`` (``~`` expanded)."""
    mapped_file_size_commit_log: int = 1 << 30
    mapped_file_size_consume_queue: int = 6_000_000
    slave_read_enable: bool = False
    enable_property_filter: bool = False
    """``enablePropertyFilter``: accept SQL92 subscriptions (RocketMQ's key and default)."""
    access_message_in_memory_max_ratio: int = 40
    sync_flush_timeout_ms: int = 2000
    """``syncFlushTimeout``: bound of a SYNC_FLUSH wait and of a SYNC_MASTER wait for a slave ack. 2000 ms, not
    RocketMQ's 5000, so the broker's FLUSH_*_TIMEOUT answer reaches a client inside the SDK's 3 s send timeout."""
    ha_send_heartbeat_interval_ms: int = 5000
    ha_housekeeping_interval_ms: int = 20_000
    ha_transfer_batch_size: int = 32_768
    ha_async_transfer_delay_ms: int = 2
    """``haAsyncTransferDelayMs`` (SplitMQ): an ASYNC_MASTER gathers appends smaller than ``haTransferBatchSize``
    for at most this long before streaming them to its slaves (RocketMQ's writer looks for new data every 100 ms
    when caught up; SplitMQ sent every append at once, which cost a slave wake-up and an ack a message)."""
    ha_max_gap_not_in_sync: int = 268_435_456
    """``haMaxGapNotInSync`` (4.x: ``haSlaveFallbehindMax``), bytes."""
    ha_max_connections: int = 64
    """``haMaxConnections`` (SplitMQ): reporting slaves a master keeps at once."""
    ha_max_pending_connections: int = 16
    """``haMaxPendingConnections`` (SplitMQ): HA connections that have not reported yet; a newcomer replaces the
    oldest."""
    ha_pending_timeout_ms: int = 3000
    """``haPendingTimeoutMs`` (SplitMQ): an HA connection without an offset report this long is closed."""
    ha_auth_secret: str = attrs.field(default="", repr=False)
    """``haAuthSecret`` (SplitMQ): the cluster secret of the HA and DLedger peer ports ('' = no handshake)."""
    in_sync_replicas: int = 2
    """``inSyncReplicas``: copies of a SYNC_MASTER put before SEND_OK, the master's counted (RocketMQ 5's default
    is 1, no slave wait; 2 keeps 4.9.3's one-slave wait, decision 5)."""
    min_in_sync_replicas: int = 1
    """``minInSyncReplicas``: the fewest copies with ``enableAutoInSyncReplicas``."""
    enable_auto_in_sync_replicas: bool = False
    """``enableAutoInSyncReplicas``: wait for as many copies as replicas are in sync, between the two above."""
    register_name_server_period_ms: int = 30_000
    register_name_server_period_min_ms: int = 10_000
    """``registerNameServerPeriodMinMs`` (SplitMQ, for tests): lower clamp of the registration period."""
    register_broker_timeout_ms: int = 6000
    default_topic_queue_nums: int = 8
    auto_create_topic_enable: bool = False
    """``autoCreateTopicEnable``: a send to an unknown topic creates it (from ``TBW102``). Off by default, unlike
    RocketMQ (on): a typo in a topic name is an error naming the topic, not a new topic (docs/OPERATIONS.md)."""
    auto_create_subscription_group: bool = True
    max_message_size: int = 4 * 1024 * 1024
    max_request_body_bytes: int = 16 * 1024 * 1024
    """``maxRequestBodyBytes`` (SplitMQ): larger HTTP bodies are refused with code 13 / HTTP 413."""
    max_inflight_request_body_bytes: int = 64 * 1024 * 1024
    """``maxInflightRequestBodyBytes`` (SplitMQ): bound on the bytes of all request bodies held at once."""
    max_auto_create_topics: int = 1024
    """``maxAutoCreateTopics`` (SplitMQ): sends stop auto-creating topics once the broker holds this many."""
    max_auto_create_subscription_groups: int = 10_000
    """``maxAutoCreateSubscriptionGroups`` (SplitMQ): auto-creation of groups stops at this many groups."""
    http_header_timeout_ms: int = 10_000
    """``httpHeaderTimeoutMs`` (SplitMQ): a request head must be complete within this."""
    http_body_timeout_ms: int = 30_000
    """``httpBodyTimeoutMs`` (SplitMQ): a request body must be complete this long after its head."""
    http_max_connections: int = 4096
    """``httpMaxConnections`` (SplitMQ): open HTTP connections; a new one past it is closed at once."""
    http_max_connections_per_client: int = 1024
    """``httpMaxConnectionsPerClient`` (SplitMQ): open HTTP connections from one peer address."""
    protected_mode: bool = True
    """``protectedMode`` (SplitMQ): a port without its credential serves loopback peers only, and a non-loopback
    bind refuses to start until every port has one (docs/SECURITY.md); false serves without them."""
    broker_permission: int = int(Perm.READ | Perm.WRITE)
    flush_interval_commit_log_ms: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval_ms: int = 10_000
    flush_interval_consume_queue_ms: int = 1000
    flush_consumer_offset_interval_ms: int = 5000
    flush_delay_offset_interval_ms: int = 10_000
    timer_wheel_enable: bool = True
    """``timerWheelEnable``: timed delivery (RocketMQ 5 timer messages); off, timer properties are ignored."""
    timer_max_delay_sec: int = 7 * 24 * 3600
    """``timerMaxDelaySec``: a timed message due further ahead is refused (RocketMQ 5's default is 3 days)."""
    timer_roll_window_slot: int = 2 * 24 * 3600
    """``timerRollWindowSlot``: seconds ahead the timer holds messages in memory; later ones are read again."""
    timer_max_in_memory: int = 100_000
    """``timerMaxInMemory`` (SplitMQ): bound on timed messages held in memory at once."""
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    message_index_enable: bool = True
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 20_000_000
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    long_polling_enable: bool = True
    short_polling_time_ms: int = 1000
    max_suspend_timeout_ms: int = 30_000
    """``maxSuspendTimeoutMs`` (SplitMQ): upper bound of a parked pull, whatever the request asks."""
    max_parked_pulls: int = 10_000
    """``maxParkedPulls`` (SplitMQ): more parked pulls than this are answered at once."""
    offset_check_in_slave: bool = False
    slave_metadata_sync_interval_ms: int = 10_000
    truncate_corrupt_commit_log: bool = False
    """``truncateCorruptCommitLog`` (SplitMQ): recovery truncates at a corrupt record instead of refusing."""
    clean_resource_interval_ms: int = 10_000
    """``cleanResourceInterval``: milliseconds between retention passes."""
    file_reserved_time_h: float = 72.0
    """``fileReservedTime``: hours after its last write a commit-log file expires (fractions allowed)."""
    delete_when: str = "04"
    """``deleteWhen``: hours of the day, ``;``-separated, at which expired files are deleted."""
    disk_max_used_space_ratio: int = 75
    """``diskMaxUsedSpaceRatio`` (percent): above it expired files go whatever the hour."""
    disk_space_clean_forcibly_ratio: int = 85
    """``diskSpaceCleanForciblyRatio`` (percent): above it the oldest files go even before they expire."""
    disk_space_warning_level_ratio: int = 90
    """``diskSpaceWarningLevelRatio`` (percent): above it sends are refused until usage drops."""
    clean_file_forcibly_enable: bool = True
    delete_file_batch_max: int = 10
    delete_commit_log_files_interval_ms: int = 100
    destroy_maped_file_interval_forcibly_ms: int = 120_000
    enable_dleger_commit_log: bool = False
    """``enableDLegerCommitLog``: the commit log is a DLedger (Raft) log shared by ``dLegerPeers``; the elected
    leader is the group's master (docs/BEHAVIOUR.md 9.8). ``brokerRole`` and ``brokerId`` then follow the election."""
    dleger_group: str = ""
    """``dLegerGroup`` ('' = brokerName)."""
    dleger_peers: tuple[tuple[str, str], ...] = ()
    """``dLegerPeers``: ``n0-host:port;n1-host:port;...`` as ``((id, host:port), ...)``."""
    dleger_self_id: str = ""
    """``dLegerSelfId``: this broker's id among the peers."""
    preferred_leader_id: str = ""
    """``preferredLeaderId``: the peer the leader hands leadership to when it is healthy and caught up."""
    heart_beat_time_interval_ms: int = 2000
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    max_pending_requests_num: int = 10_000
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000
    mapped_file_size_for_entry_index: int = 32 * 5 * 1024 * 1024
    dleger_pre_vote: bool = True
    """``dLegerPreVote`` (SplitMQ): ask before raising the term, so a member cut off and healed cannot depose a
    healthy leader (Raft thesis 9.6; DLedger has no pre-vote)."""
    acl_enable: bool = False
    """``aclEnable``: every HTTP request must be signed by an account of ``aclFile`` and hold the permission its
    endpoint needs (docs/SECURITY.md)."""
    acl_file: str = ""
    """``aclFile``: the accounts file (TOML), re-read when it changes."""
    access_key: str = ""
    """``accessKey``: the broker's own account, signing its registrations and its slave metadata sync."""
    secret_key: str = attrs.field(default="", repr=False)
    """``secretKey``: that account's secret (never logged)."""
    acl_timestamp_tolerance_ms: int = 30_000
    """``aclTimestampToleranceMs``: how far a signed request's timestamp may be from the broker's clock."""
    acl_nonce_cache_max: int = 1_000_000
    """``aclNonceCacheMax``: signatures the replay guard remembers at most (past it: SYSTEM_BUSY)."""
    acl_metrics_token: str = attrs.field(default="", repr=False)
    """``aclMetricsToken``: ``Authorization: Bearer <token>`` opens ``GET /metrics`` to a scraper ('' = admin only)."""
    acl_server_names: tuple[str, ...] = ()
    """``aclServerNames``: ``host:port`` names clients may sign for besides the address a connection arrives on and
    ``brokerIP1:listenPort`` (a DNS name, a NAT address)."""
    transaction_check_interval_ms: int = 60_000
    """``transactionCheckInterval``: milliseconds between check rounds of half messages (master only)."""
    transaction_time_out_ms: int = 6000
    """``transactionTimeOut``: a half message younger than this (by born time) is not checked back yet."""
    transaction_check_max: int = 15
    """``transactionCheckMax``: check-backs of one transaction before it moves to TRANS_CHECK_MAX_TIME_TOPIC."""
    duplicate_window_ms: int = 120_000
    """``duplicateWindowMs`` (SplitMQ): how long a master answers a re-sent idempotent message with its first copy
    instead of storing it again (by store time); 0 ignores the idempotent bit (docs/GUIDE.md, "Idempotent sends")."""
    duplicate_window_max_keys: int = 500_000
    """``duplicateWindowMaxKeys`` (SplitMQ): keys the duplicate window holds at most, about 155 bytes each in
    batches (340 for single sends); past it the oldest leave before their time (:mod:`broker.dedup`)."""
    tls_enable: bool = False
    """``tlsEnable`` (SplitMQ): the HTTP, HA and DLedger peer ports speak TLS only, and so do the broker's own
    connections (nameservers, its master, its peers)."""
    tls_cert_file: str = ""
    """``tlsCertFile``: PEM certificate chain the broker's ports present (its SANs cover the advertised IPs)."""
    tls_key_file: str = ""
    """``tlsKeyFile``: the certificate's private key (PEM, unencrypted)."""
    tls_ca_file: str = ""
    """``tlsCaFile``: CA the broker verifies nameservers, its master and its peers against ('' = system store)."""
    tls_peer_client_auth: bool = False
    """``tlsPeerClientAuth``: mutual TLS on the HA and DLedger ports (peers present ``tlsCertFile``)."""

    @classmethod
    def from_properties(cls, props: Mapping[str, str]) -> BrokerConfig:
        """Build from ``{camelCaseKey: value}`` (unknown keys ignored; use :func:`load_config` to learn them).

        Raises:
            ConfigError: a bad value or a broken role rule, naming the key.
        """
        return config_from_properties(props, env={}).config

    @property
    def is_slave(self) -> bool:
        return self.broker_role is BrokerRole.SLAVE

    @property
    def dledger_group(self) -> str:
        return self.dleger_group or self.broker_name

    @property
    def dledger_broker_id(self) -> int:
        """The id a DLedger follower registers with: the number in its peer id plus one (n0 -> 1), docs/BEHAVIOUR.md 9.8."""
        digits = self.dleger_self_id[1:]
        return int(digits) + 1 if digits.isdigit() else 1 + [p for p, _ in self.dleger_peers].index(self.dleger_self_id)

    @property
    def advertised_ip(self) -> str:
        return self.broker_ip1

    @property
    def ha_ip(self) -> str:
        return self.broker_ip2 or self.broker_ip1

    @property
    def bind_host(self) -> str:
        return self.bind_address or self.broker_ip1

    @property
    def http_open(self) -> bool:
        """The HTTP port serves any peer: ``aclEnable`` guards it, or ``protectedMode=false`` opened it."""
        return self.acl_enable or not self.protected_mode

    @property
    def peer_port_open(self) -> bool:
        """The HA (or DLedger peer) port serves any peer: ``haAuthSecret`` guards it, or ``protectedMode=false``."""
        return bool(self.ha_auth_secret) or not self.protected_mode

    def protected_mode_refusal(self) -> str | None:
        """Why this broker must not start (None: it may): protected mode, a non-loopback bind, and a port it would
        open without the credential that guards it. The message names the keys to set."""
        if not self.protected_mode or is_loopback(self.bind_host):
            return None
        peer_port = "DLedger peer port" if self.enable_dleger_commit_log else "HA port"
        missing = []
        if not self.acl_enable:
            missing.append("aclEnable=true with aclFile (for the HTTP port)")
        if not self.ha_auth_secret:
            missing.append(f"haAuthSecret (for the {peer_port})")
        if not missing:
            return None
        return (f"protected mode: bindAddress/brokerIP1 {self.bind_host} is not a loopback address, and without "
                f"{' and '.join(missing)} anyone who reaches it could read, write and administer this broker. Set "
                f"them (docs/SECURITY.md; `splitmq cluster up --secure` writes a complete set), bind to 127.0.0.1, "
                f"or set protectedMode=false to serve without them")

    def protected_mode_warnings(self) -> list[str]:
        """The loud lines a broker logs at start when ``protectedMode=false`` leaves a port open to anyone."""
        if self.protected_mode:
            return []
        out = []
        if not self.acl_enable:
            out.append(f"SECURITY: protectedMode=false and aclEnable=false: the HTTP port on {self.bind_host} serves "
                       f"ANYONE who reaches it -- they can read, write and administer this broker")
        if not self.ha_auth_secret:
            port = "DLedger peer port" if self.enable_dleger_commit_log else "HA port"
            out.append(f"SECURITY: protectedMode=false and no haAuthSecret: the {port} on {self.bind_host} serves "
                       f"ANYONE who reaches it -- the whole commit log{' and its writes' if port[0] == 'D' else ''}")
        return out

    @property
    def register_period_ms(self) -> int:
        """RocketMQ's clamp ``max(10000, min(period, 60000))`` (the lower bound is configurable for tests)."""
        return max(self.register_name_server_period_min_ms, min(self.register_name_server_period_ms, 60_000))

    @property
    def store_root(self) -> Path:
        return Path(os.path.expanduser(self.store_path_root_dir))

    @property
    def config_dir(self) -> Path:
        return self.store_root / "config"

    def to_store_config(self, store_host: bytes) -> StoreConfig:
        """The store's configuration; the broker drives dispatch from its event loop.

        Args:
            store_host: packed ``ip + port`` of the bound client address (:func:`common.codec.pack_host`).
        """
        return StoreConfig(
            store_path_root_dir=str(self.store_root),
            mapped_file_size_commitlog=self.mapped_file_size_commit_log,
            mapped_file_size_consume_queue=self.mapped_file_size_consume_queue,
            flush_disk_type=self.flush_disk_type,
            broker_role=self.broker_role,
            sync_flush_timeout_ms=self.sync_flush_timeout_ms,
            flush_interval_commitlog_ms=self.flush_interval_commit_log_ms,
            flush_commitlog_least_pages=self.flush_commit_log_least_pages,
            flush_commitlog_thorough_interval_ms=self.flush_commit_log_thorough_interval_ms,
            flush_interval_consume_queue_ms=self.flush_interval_consume_queue_ms,
            max_message_size=self.max_message_size,
            access_message_in_memory_max_ratio=self.access_message_in_memory_max_ratio,
            max_transfer_bytes_on_message_in_memory=self.max_transfer_bytes_on_message_in_memory,
            max_transfer_count_on_message_in_memory=self.max_transfer_count_on_message_in_memory,
            max_transfer_bytes_on_message_in_disk=self.max_transfer_bytes_on_message_in_disk,
            max_transfer_count_on_message_in_disk=self.max_transfer_count_on_message_in_disk,
            message_index_enable=self.message_index_enable,
            max_hash_slot_num=self.max_hash_slot_num,
            max_index_num=self.max_index_num,
            message_delay_level=self.message_delay_level,
            offset_check_in_slave=self.offset_check_in_slave,
            truncate_corrupt=self.truncate_corrupt_commit_log,
            store_host=store_host,
            retention=self.to_retention_config(),
            destroy_mapped_file_interval_forcibly_ms=self.destroy_maped_file_interval_forcibly_ms,
        )

    def to_retention_config(self) -> RetentionConfig:
        """The store cleaner's settings (percent keys become fractions)."""
        return RetentionConfig(
            file_reserved_time_ms=int(self.file_reserved_time_h * 3_600_000),
            delete_when=parse_delete_when(self.delete_when),
            disk_max_used_space_ratio=self.disk_max_used_space_ratio / 100,
            disk_space_clean_forcibly_ratio=self.disk_space_clean_forcibly_ratio / 100,
            disk_space_warning_level_ratio=self.disk_space_warning_level_ratio / 100,
            clean_file_forcibly_enable=self.clean_file_forcibly_enable,
            delete_file_batch_max=self.delete_file_batch_max,
        )

    def check_derived(self) -> None:
        """Build the store and HA configurations once, so their own validation fails at load time.

        Raises:
            ConfigError: one of them refuses a value (its message names the field).
        """
        if self.acl_enable and not self.acl_file:
            raise ConfigError("aclEnable=true needs aclFile (the accounts file)")
        if bool(self.access_key) != bool(self.secret_key):
            raise ConfigError("accessKey and secretKey go together: set both or neither")
        if self.tls_enable:
            try:
                self.tls_contexts()
            except TlsConfigError as e:
                raise ConfigError(f"tlsEnable=true: {e}") from None
        try:
            self.to_store_config(b"\x7f\x00\x00\x01\x00\x00\x00\x00")
            self.to_ha_config()
        except (ValueError, TypeError) as e:
            raise ConfigError(f"invalid configuration: {e}") from None

    def tls_contexts(self) -> BrokerTls | None:
        """The broker's TLS contexts with ``tlsEnable``, else None (see :class:`BrokerTls`).

        Raises:
            TlsConfigError: a file is missing or unusable (the message names the key).
        """
        if not self.tls_enable:
            return None
        if not self.tls_cert_file or not self.tls_key_file:
            raise TlsConfigError("tlsCertFile and tlsKeyFile are needed")
        ca = self.tls_ca_file or None
        http = server_context(self.tls_cert_file, self.tls_key_file)
        peer = (server_context(self.tls_cert_file, self.tls_key_file, ca_file=ca, require_client_cert=True)
                if self.tls_peer_client_auth else http)
        mine = (self.tls_cert_file, self.tls_key_file) if self.tls_peer_client_auth else (None, None)
        return BrokerTls(http_server=http, peer_server=peer,
                         client=client_context(ca, cert_file=mine[0], key_file=mine[1], ca_option="tlsCaFile"))

    def to_ha_config(self) -> HAConfig:
        """The HA service's configuration."""
        return HAConfig(
            ha_send_heartbeat_interval_ms=self.ha_send_heartbeat_interval_ms,
            ha_housekeeping_interval_ms=self.ha_housekeeping_interval_ms,
            ha_transfer_batch_size=self.ha_transfer_batch_size,
            ha_transfer_delay_ms=self.ha_async_transfer_delay_ms if self.broker_role is BrokerRole.ASYNC_MASTER else 0,
            ha_max_gap_not_in_sync=self.ha_max_gap_not_in_sync,
            ha_max_connections=self.ha_max_connections,
            ha_max_pending_connections=self.ha_max_pending_connections,
            ha_pending_timeout_ms=self.ha_pending_timeout_ms,
            ha_auth_secret=self.ha_auth_secret.encode(),
            loopback_only=not self.peer_port_open,
            advertised_names=(f"{self.ha_ip}:{self.ha_listen_port}",) if self.ha_listen_port else (),
            in_sync_replicas=self.in_sync_replicas,
            min_in_sync_replicas=self.min_in_sync_replicas,
            enable_auto_in_sync_replicas=self.enable_auto_in_sync_replicas,
        )


@attrs.frozen(eq=False)
class BrokerTls:
    """The TLS contexts of a broker with ``tlsEnable`` (built once at start)."""

    http_server: ssl.SSLContext
    """The HTTP port's: presents ``tlsCertFile``; clients are not asked for a certificate."""
    peer_server: ssl.SSLContext
    """The HA and DLedger ports': as ``http_server``, and with ``tlsPeerClientAuth`` it demands a peer
    certificate signed by ``tlsCaFile``."""
    client: ssl.SSLContext
    """The broker's own connections (nameservers, master HTTP and HA, DLedger peers): verifies against
    ``tlsCaFile``, presenting ``tlsCertFile`` with ``tlsPeerClientAuth``."""


# --- conversion ------------------------------------------------------------------------------------------

Converter = Callable[[str, str], Any]


def _int(lo: int | None = None, hi: int | None = None) -> Converter:
    def conv(key: str, raw: str) -> int:
        try:
            v = int(raw, 10)
        except ValueError:
            raise ConfigError(f"{key}={raw!r} is not an integer") from None
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise ConfigError(f"{key}={v} is outside [{lo}, {'...' if hi is None else hi}]")
        return v

    return conv


def _bool(key: str, raw: str) -> bool:
    low = raw.lower()
    if low not in ("true", "false"):
        raise ConfigError(f"{key}={raw!r} is not true or false")
    return low == "true"


def _str(key: str, raw: str) -> str:
    if not raw:
        raise ConfigError(f"{key} is empty")
    return raw


def _secret(key: str, raw: str) -> str:
    """Any text, empty included (an empty ``haAuthSecret`` means no handshake); never quoted in an error."""
    return raw


def _opt_str(key: str, raw: str) -> str | None:
    return raw or None


def _ip(key: str, raw: str) -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not an IP address") from None


def _opt_ip(key: str, raw: str) -> str:
    return _ip(key, raw) if raw else ""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address, or ``localhost``) is a loopback address."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _names(key: str, raw: str) -> tuple[str, ...]:
    return tuple(_host_port(key, part.strip()) for part in raw.replace(",", ";").split(";") if part.strip())


def _enum(cls: type[BrokerRole] | type[FlushDiskType]) -> Converter:
    def conv(key: str, raw: str) -> Any:
        try:
            return cls(raw)
        except ValueError:
            allowed = ", ".join(m.value for m in cls)
            raise ConfigError(f"{key}={raw!r} is not one of {allowed}") from None

    return conv


def _host_port(key: str, item: str) -> str:
    host, sep, port = item.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"{key}: {item!r} is not host:port (expected e.g. 127.0.0.1:9876;192.168.0.1:9876)")
    return item


def _namesrv(key: str, raw: str) -> tuple[str, ...]:
    return tuple(_host_port(key, part.strip()) for part in raw.split(";") if part.strip())


def _ha_master(key: str, raw: str) -> str | None:
    return _host_port(key, raw) if raw else None


def _delay_levels(key: str, raw: str) -> str:
    try:
        parse_delay_levels(raw)
    except ValueError as e:
        raise ConfigError(f"{key}={raw!r}: {e}") from None
    return raw


def _hours(key: str, raw: str) -> float:
    try:
        v = float(raw)
    except ValueError:
        raise ConfigError(f"{key}={raw!r} is not a number of hours") from None
    if not 0 < v < 1e6:
        raise ConfigError(f"{key}={raw!r} must be a positive number of hours")
    return v


def _dleger_peers(key: str, raw: str) -> tuple[tuple[str, str], ...]:
    peers: list[tuple[str, str]] = []
    for item in filter(None, (x.strip() for x in raw.split(";"))):
        pid, sep, addr = item.partition("-")
        if not sep or not pid:
            raise ConfigError(f"{key}: {item!r} is not id-host:port (e.g. n0-127.0.0.1:40911)")
        if any(p == pid for p, _ in peers):
            raise ConfigError(f"{key}: peer id {pid} appears twice")
        peers.append((pid, _host_port(key, addr)))
    if not peers:
        raise ConfigError(f"{key} is empty")
    return tuple(peers)


def _entry_index_size(key: str, raw: str) -> int:
    size = _int(32 * 1024)(key, raw)
    if size % 32:
        raise ConfigError(f"{key}={raw}: must be a multiple of the 32-byte index unit")
    return int(size)


def _delete_when(key: str, raw: str) -> str:
    try:
        parse_delete_when(raw)
    except ValueError as e:
        raise ConfigError(f"{key}={raw!r}: {e}") from None
    return raw


_P = _int(1)
_NN = _int(0)
_PORT = _int(0, 65535)

#: camelCase key -> (field, converter). Aliases map to the same field.
KEYS: dict[str, tuple[str, Converter]] = {
    "brokerClusterName": ("broker_cluster_name", _str),
    "brokerName": ("broker_name", _str),
    "brokerId": ("broker_id", _int()),
    "brokerRole": ("broker_role", _enum(BrokerRole)),
    "flushDiskType": ("flush_disk_type", _enum(FlushDiskType)),
    "namesrvAddr": ("namesrv_addr", _namesrv),
    "brokerIP1": ("broker_ip1", _ip),
    "brokerIP2": ("broker_ip2", _opt_ip),
    "bindAddress": ("bind_address", _opt_ip),
    "listenPort": ("listen_port", _PORT),
    "haListenPort": ("ha_listen_port", _int(None, 65535)),
    "haMasterAddress": ("ha_master_address", _ha_master),
    "storePathRootDir": ("store_path_root_dir", _str),
    "mappedFileSizeCommitLog": ("mapped_file_size_commit_log", _int(4096)),
    "mappedFileSizeConsumeQueue": ("mapped_file_size_consume_queue", _int(20)),
    "slaveReadEnable": ("slave_read_enable", _bool),
    "enablePropertyFilter": ("enable_property_filter", _bool),
    "accessMessageInMemoryMaxRatio": ("access_message_in_memory_max_ratio", _int(0, 100)),
    "syncFlushTimeout": ("sync_flush_timeout_ms", _P),
    "haSendHeartbeatInterval": ("ha_send_heartbeat_interval_ms", _P),
    "haHousekeepingInterval": ("ha_housekeeping_interval_ms", _P),
    "haTransferBatchSize": ("ha_transfer_batch_size", _P),
    "haAsyncTransferDelayMs": ("ha_async_transfer_delay_ms", _int(0, 60_000)),
    "haMaxGapNotInSync": ("ha_max_gap_not_in_sync", _P),
    "haSlaveFallbehindMax": ("ha_max_gap_not_in_sync", _P),
    "haMaxConnections": ("ha_max_connections", _P),
    "haMaxPendingConnections": ("ha_max_pending_connections", _P),
    "haPendingTimeoutMs": ("ha_pending_timeout_ms", _P),
    "haAuthSecret": ("ha_auth_secret", _secret),
    "inSyncReplicas": ("in_sync_replicas", _P),
    "minInSyncReplicas": ("min_in_sync_replicas", _P),
    "enableAutoInSyncReplicas": ("enable_auto_in_sync_replicas", _bool),
    "registerNameServerPeriod": ("register_name_server_period_ms", _P),
    "registerNameServerPeriodMinMs": ("register_name_server_period_min_ms", _P),
    "registerBrokerTimeoutMills": ("register_broker_timeout_ms", _P),
    "defaultTopicQueueNums": ("default_topic_queue_nums", _int(1, 1024)),
    "autoCreateTopicEnable": ("auto_create_topic_enable", _bool),
    "autoCreateSubscriptionGroup": ("auto_create_subscription_group", _bool),
    "maxMessageSize": ("max_message_size", _int(256)),
    "maxRequestBodyBytes": ("max_request_body_bytes", _int(1024)),
    "maxInflightRequestBodyBytes": ("max_inflight_request_body_bytes", _int(1024)),
    "maxAutoCreateTopics": ("max_auto_create_topics", _int(1)),
    "maxAutoCreateSubscriptionGroups": ("max_auto_create_subscription_groups", _int(1)),
    "httpHeaderTimeoutMs": ("http_header_timeout_ms", _int(1)),
    "httpBodyTimeoutMs": ("http_body_timeout_ms", _int(1)),
    "httpMaxConnections": ("http_max_connections", _int(1)),
    "httpMaxConnectionsPerClient": ("http_max_connections_per_client", _int(1)),
    "protectedMode": ("protected_mode", _bool),
    "brokerPermission": ("broker_permission", _int(0, 15)),
    "flushIntervalCommitLog": ("flush_interval_commit_log_ms", _P),
    "flushCommitLogLeastPages": ("flush_commit_log_least_pages", _NN),
    "flushCommitLogThoroughInterval": ("flush_commit_log_thorough_interval_ms", _NN),
    "flushIntervalConsumeQueue": ("flush_interval_consume_queue_ms", _P),
    "flushConsumerOffsetInterval": ("flush_consumer_offset_interval_ms", _P),
    "flushDelayOffsetInterval": ("flush_delay_offset_interval_ms", _P),
    "timerWheelEnable": ("timer_wheel_enable", _bool),
    "timerMaxDelaySec": ("timer_max_delay_sec", _P),
    "timerRollWindowSlot": ("timer_roll_window_slot", _P),
    "timerMaxInMemory": ("timer_max_in_memory", _P),
    "duplicateWindowMs": ("duplicate_window_ms", _NN),
    "duplicateWindowMaxKeys": ("duplicate_window_max_keys", _P),
    "messageDelayLevel": ("message_delay_level", _delay_levels),
    "messageIndexEnable": ("message_index_enable", _bool),
    "maxHashSlotNum": ("max_hash_slot_num", _P),
    "maxIndexNum": ("max_index_num", _int(2)),
    "maxTransferBytesOnMessageInMemory": ("max_transfer_bytes_on_message_in_memory", _P),
    "maxTransferCountOnMessageInMemory": ("max_transfer_count_on_message_in_memory", _P),
    "maxTransferBytesOnMessageInDisk": ("max_transfer_bytes_on_message_in_disk", _P),
    "maxTransferCountOnMessageInDisk": ("max_transfer_count_on_message_in_disk", _P),
    "longPollingEnable": ("long_polling_enable", _bool),
    "shortPollingTimeMills": ("short_polling_time_ms", _P),
    "maxSuspendTimeoutMs": ("max_suspend_timeout_ms", _P),
    "maxParkedPulls": ("max_parked_pulls", _P),
    "offsetCheckInSlave": ("offset_check_in_slave", _bool),
    "slaveMetadataSyncInterval": ("slave_metadata_sync_interval_ms", _P),
    "truncateCorruptCommitLog": ("truncate_corrupt_commit_log", _bool),
    "cleanResourceInterval": ("clean_resource_interval_ms", _P),
    "fileReservedTime": ("file_reserved_time_h", _hours),
    "deleteWhen": ("delete_when", _delete_when),
    "diskMaxUsedSpaceRatio": ("disk_max_used_space_ratio", _int(10, 95)),
    "diskSpaceCleanForciblyRatio": ("disk_space_clean_forcibly_ratio", _int(10, 99)),
    "diskSpaceWarningLevelRatio": ("disk_space_warning_level_ratio", _int(10, 99)),
    "cleanFileForciblyEnable": ("clean_file_forcibly_enable", _bool),
    "deleteFileBatchMax": ("delete_file_batch_max", _P),
    "deleteCommitLogFilesInterval": ("delete_commit_log_files_interval_ms", _NN),
    "destroyMapedFileIntervalForcibly": ("destroy_maped_file_interval_forcibly_ms", _P),
    "enableDLegerCommitLog": ("enable_dleger_commit_log", _bool),
    "dLegerGroup": ("dleger_group", _str),
    "dLegerPeers": ("dleger_peers", _dleger_peers),
    "dLegerSelfId": ("dleger_self_id", _str),
    "preferredLeaderId": ("preferred_leader_id", _str),
    "heartBeatTimeIntervalMs": ("heart_beat_time_interval_ms", _int(10)),
    "maxHeartBeatLeak": ("max_heart_beat_leak", _P),
    "minVoteIntervalMs": ("min_vote_interval_ms", _P),
    "maxVoteIntervalMs": ("max_vote_interval_ms", _P),
    "maxPendingRequestsNum": ("max_pending_requests_num", _P),
    "maxWaitAckTimeMs": ("max_wait_ack_time_ms", _P),
    "maxPushTimeOutMs": ("max_push_time_out_ms", _P),
    "mappedFileSizeForEntryIndex": ("mapped_file_size_for_entry_index", _entry_index_size),
    "dLegerPreVote": ("dleger_pre_vote", _bool),
    "aclEnable": ("acl_enable", _bool),
    "aclFile": ("acl_file", _str),
    "accessKey": ("access_key", _str),
    "secretKey": ("secret_key", _str),
    "aclTimestampToleranceMs": ("acl_timestamp_tolerance_ms", _P),
    "aclNonceCacheMax": ("acl_nonce_cache_max", _P),
    "aclMetricsToken": ("acl_metrics_token", _str),
    "aclServerNames": ("acl_server_names", _names),
    "transactionCheckInterval": ("transaction_check_interval_ms", _P),
    "transactionTimeOut": ("transaction_time_out_ms", _NN),
    "transactionCheckMax": ("transaction_check_max", _P),
    "tlsEnable": ("tls_enable", _bool),
    "tlsCertFile": ("tls_cert_file", _str),
    "tlsKeyFile": ("tls_key_file", _str),
    "tlsCaFile": ("tls_ca_file", _str),
    "tlsPeerClientAuth": ("tls_peer_client_auth", _bool),
}


#: camelCase key -> one-line meaning, for ``docs/OPERATIONS.md`` (rendered by ``docs/gen_operations.py``; a test
#: checks that every key of :data:`KEYS` has one and that the document is up to date).
KEY_DOCS: dict[str, str] = {
    "brokerClusterName": "Cluster the broker registers under (the nameserver's `clusterAddrTable` key).",
    "brokerName": "Broker group name; a master and its slaves share it.",
    "brokerId": "0 for the master; a slave needs an id > 0. Masters are forced to 0 whatever the file says.",
    "brokerRole": "`ASYNC_MASTER`, `SYNC_MASTER` (a send waits for slave acks, see `inSyncReplicas`) or `SLAVE`.",
    "flushDiskType": "`ASYNC_FLUSH` (flush in the background) or `SYNC_FLUSH` (a send waits for the fsync).",
    "namesrvAddr": "Nameservers, `host:port` separated by `;` (default: the `NAMESRV_ADDR` environment variable).",
    "brokerIP1": "IP registered for clients: the broker's address is `brokerIP1:listenPort`.",
    "brokerIP2": "IP registered for the HA address `brokerIP2:haListenPort` (empty: brokerIP1).",
    "bindAddress": "SplitMQ: interface the HTTP and HA sockets bind to (empty: brokerIP1).",
    "listenPort": "HTTP port for clients; 0 lets the OS choose (the ready line prints the real one).",
    "haListenPort": "TCP port of the HA stream; 0 or unset derives `listenPort + 1` (0 when listenPort is 0).",
    "haMasterAddress": "A slave's fixed master HA address `host:port`; when set it is never taken from the nameserver.",
    "storePathRootDir": "Root of the store: commit log, consume queues, index, checkpoint, `config/` (`~` expanded).",
    "mappedFileSizeCommitLog": "Size in bytes of each commit-log file, preallocated; a record never spans two files.",
    "mappedFileSizeConsumeQueue": "Size in bytes of each consume-queue file (rounded up to a multiple of the 20-byte unit).",
    "slaveReadEnable": "Slaves serve pulls, and a master sends consumers that fall behind to a slave (false: RocketMQ's "
                       "default; `LocalCluster` and `splitmq cluster up` set true).",
    "enablePropertyFilter": "Accept SQL92 property filters (`MessageSelector.sql`) on pulls and heartbeats; false refuses them with NO_PERMISSION naming this key.",
    "accessMessageInMemoryMaxRatio": "Percent of the broker's memory (RAM, or its memory cgroup's limit when smaller, re-read every 15 s): a pull further than this behind the newest message counts as cold (suggest a slave).",
    "syncFlushTimeout": "Milliseconds a send waits for a SYNC_FLUSH fsync or SYNC_MASTER slave acks before answering FLUSH_DISK_TIMEOUT / FLUSH_SLAVE_TIMEOUT.",
    "haSendHeartbeatInterval": "Milliseconds between a slave's idle offset reports and the master's heartbeat frames.",
    "haHousekeepingInterval": "Milliseconds without bytes from the other side after which an HA connection is dropped.",
    "haTransferBatchSize": "Largest body in bytes of one master-to-slave HA frame.",
    "haAsyncTransferDelayMs": "SplitMQ, ASYNC_MASTER: milliseconds appends smaller than `haTransferBatchSize` may wait to be streamed to slaves together (one slave wake-up and one ack for many small sends); 0 streams each append at once. SYNC_MASTER always streams at once.",
    "haMaxGapNotInSync": "A slave is in sync while it is connected and its own last ack is less than this many bytes behind a put; only in-sync slaves let a SYNC_MASTER send wait (see `inSyncReplicas`).",
    "inSyncReplicas": "SYNC_MASTER: copies a send needs before SEND_OK, the master's counted: 2 waits for one slave's ack, 1 for none (RocketMQ 5's default is 1). Fewer replicas in sync than that: SLAVE_NOT_AVAILABLE at once.",
    "minInSyncReplicas": "With `enableAutoInSyncReplicas`: the fewest copies (master counted) a SYNC_MASTER send settles for; must be <= `inSyncReplicas`.",
    "enableAutoInSyncReplicas": "SYNC_MASTER: a send needs as many copies as replicas are in sync, at most `inSyncReplicas` and at least `minInSyncReplicas`.",
    "haSlaveFallbehindMax": "RocketMQ 4.x name of `haMaxGapNotInSync`; sets the same value.",
    "haMaxConnections": "SplitMQ: slaves (connections that have sent an offset report) a master keeps at once; a first report past it closes that connection.",
    "haMaxPendingConnections": "SplitMQ: HA connections a master keeps before their first offset report; a newcomer past it replaces the oldest of them.",
    "haPendingTimeoutMs": "SplitMQ: milliseconds an HA connection may stay without an offset report before the master closes it (a real slave reports at once).",
    "haAuthSecret": "SplitMQ: cluster secret of the HA and DLedger peer ports, the same on every broker; when set, both ends of every HA and peer connection prove they know it (HMAC challenge-response) before a byte of the log moves. Empty: no handshake (see docs/HA.md).",
    "registerNameServerPeriod": "Milliseconds between registrations with every nameserver (clamped to [registerNameServerPeriodMinMs, 60000]).",
    "registerNameServerPeriodMinMs": "SplitMQ, for tests: lower clamp of the registration period.",
    "registerBrokerTimeoutMills": "Milliseconds one registration request may take.",
    "defaultTopicQueueNums": "Queues of a topic created by its first send (at most the producer's `defaultTopicQueueNums` send argument).",
    "autoCreateTopicEnable": "A send to an unknown topic creates it (from the `TBW102` template); off: TOPIC_NOT_EXIST. "
                             "Off by default (RocketMQ: on), so a typo is an error naming the topic.",
    "autoCreateSubscriptionGroup": "A pull or send-back of an unknown group creates it; off: SUBSCRIPTION_GROUP_NOT_EXIST.",
    "maxMessageSize": "Largest stored record in bytes (body, topic, properties and header); larger is MESSAGE_ILLEGAL.",
    "maxRequestBodyBytes": "SplitMQ: largest HTTP request body in bytes; larger is refused with code 13 / HTTP 413.",
    "maxAutoCreateTopics": "SplitMQ: a send to an unknown topic auto-creates it only while the broker holds fewer topics than this (each costs consume queues and a topics.json rewrite); past it the send gets TOPIC_NOT_EXIST naming this key. Explicit creation is not limited.",
    "maxAutoCreateSubscriptionGroups": "SplitMQ: a pull or heartbeat with an unknown group auto-creates it only while the broker holds fewer groups than this; past it SUBSCRIPTION_GROUP_NOT_EXIST naming this key. Auto-created groups are written to subscriptionGroup.json at most once a second.",
    "httpHeaderTimeoutMs": "SplitMQ: milliseconds within which a request head must be complete, from the connection's start or the request's first byte; else the connection is closed (idle sockets, slowloris).",
    "httpBodyTimeoutMs": "SplitMQ: milliseconds within which a request body must be complete once its head is in; else the connection is closed.",
    "httpMaxConnections": "SplitMQ: open HTTP connections; a new connection past this is closed at once, with a warning at most once a second.",
    "httpMaxConnectionsPerClient": "SplitMQ: open HTTP connections from one peer address; a new one past this is closed at once (so one client cannot take every slot of `httpMaxConnections`).",
    "protectedMode": "SplitMQ: true (default): a port without its credential (`aclEnable` for HTTP, `haAuthSecret` for the HA / DLedger peer port) serves loopback peers only, and a broker bound to a non-loopback address without them refuses to start, naming them. false: serve anyone without them (logged loudly at start). See docs/SECURITY.md.",
    "maxInflightRequestBodyBytes": "SplitMQ: bound on the bytes of all HTTP request bodies held at once (being read or handled); a request that would pass it is refused with code 2 SYSTEM_BUSY / HTTP 503, which the SDK retries.",
    "brokerPermission": "Permission bits of the whole broker: 4 read, 2 write (6 = both); a missing bit is removed from every registered topic.",
    "flushIntervalCommitLog": "ASYNC_FLUSH: milliseconds between commit-log flushes.",
    "flushCommitLogLeastPages": "ASYNC_FLUSH: dirty 4 KiB pages needed for a periodic flush (0: flush whatever is dirty).",
    "flushCommitLogThoroughInterval": "ASYNC_FLUSH: milliseconds after which a flush happens whatever the dirty page count.",
    "flushIntervalConsumeQueue": "Milliseconds between flushes of consume queues, index files and the checkpoint.",
    "flushConsumerOffsetInterval": "Milliseconds between writes of `config/consumerOffset.json`.",
    "flushDelayOffsetInterval": "Milliseconds between writes of `config/delayOffset.json` (also written after each delivered batch).",
    "timerWheelEnable": "Timed delivery (`deliver_at_ms` / `delay_s`, RocketMQ 5 timer messages) on the master; "
                        "`false` stores timed messages at once.",
    "timerMaxDelaySec": "Longest timer a send may ask for, in seconds; beyond it the send is refused (code 13).",
    "timerRollWindowSlot": "Seconds ahead the timer keeps messages in memory; later ones are found again by reading "
                           "`rmq_sys_wheel_timer` as time advances.",
    "timerMaxInMemory": "Timed messages held in memory at most; the rest wait in the log until there is room.",
    "duplicateWindowMs": "Milliseconds (by store time) during which a master answers an idempotent producer's "
                         "re-sent message with its first copy's result instead of storing it again; rebuilt from "
                         "the log when a broker becomes master. `0` stores every message (no deduplication).",
    "duplicateWindowMaxKeys": "Unique keys the duplicate window holds at most (about 155 bytes each in batches, "
                              "340 for single sends); past it the oldest leave early, counted by "
                              "`splitmq_duplicate_window_evicted_early`.",
    "messageDelayLevel": "Delays of levels 1..N, space-separated, each a number with unit s, m, h or d.",
    "messageIndexEnable": "Index message keys and unique ids for queries by key and by msgId.",
    "maxHashSlotNum": "Hash slots per index file (4 bytes each).",
    "maxIndexNum": "Entries per index file (20 bytes each); a full file is followed by a new one.",
    "maxTransferBytesOnMessageInMemory": "Bytes per pull answer at most while the consumer reads hot data. The default is a master's (RocketMQ's); a slave (`brokerRole=SLAVE`) that does not set it serves 4194304 (4 MiB): it takes no client writes and serves the large reads of a read/write split (docs/SPARK.md).",
    "maxTransferCountOnMessageInMemory": "Messages per pull answer at most while the consumer reads hot data. The default is a master's (RocketMQ's); a slave (`brokerRole=SLAVE`) that does not set it serves 1024, what the Spark connector asks per pull (docs/SPARK.md).",
    "maxTransferBytesOnMessageInDisk": "Bytes per pull answer at most while the consumer reads cold data (a master's cap keeps cold reads from evicting its writers' pages). A slave (`brokerRole=SLAVE`) that does not set it serves 4194304: replays are cold by nature, and a slave is where they belong.",
    "maxTransferCountOnMessageInDisk": "Messages per pull answer at most while the consumer reads cold data. A slave (`brokerRole=SLAVE`) that does not set it serves 1024. DLedger members keep a master's caps (any of them may lead).",
    "longPollingEnable": "A pull that finds nothing waits for new messages up to its suspend timeout (else `shortPollingTimeMills`).",
    "shortPollingTimeMills": "Milliseconds an empty pull is held when long polling is off.",
    "maxSuspendTimeoutMs": "SplitMQ: upper bound in milliseconds of a parked pull, whatever the request asks.",
    "maxParkedPulls": "SplitMQ: parked pulls at most; further empty pulls are answered at once.",
    "offsetCheckInSlave": "A slave may answer PULL_OFFSET_MOVED (off: it sends the consumer to the master instead).",
    "slaveMetadataSyncInterval": "Milliseconds between a slave's copies of its master's topics, groups and offsets.",
    "truncateCorruptCommitLog": "SplitMQ: recovery cuts the commit log at a corrupt record instead of refusing to start.",
    "cleanResourceInterval": "Milliseconds between retention passes (disk check, expired-file deletion).",
    "fileReservedTime": "Hours after its last write a commit-log file expires (default 72; SplitMQ accepts fractions, e.g. 0.5).",
    "deleteWhen": "Hours of the local day, `;`-separated (`04;16`), at which expired commit-log files are deleted.",
    "diskMaxUsedSpaceRatio": "Percent (10..95) of the commit log's partition above which expired files are deleted whatever the hour.",
    "diskSpaceCleanForciblyRatio": "Percent above which the oldest commit-log files are deleted even before they expire, with a warning naming what each group lost (a system property in RocketMQ).",
    "diskSpaceWarningLevelRatio": "Percent of any store partition above which sends get SERVICE_NOT_AVAILABLE (disk full) until usage drops below it; reads keep working (a system property in RocketMQ).",
    "cleanFileForciblyEnable": "Allow the forced deletion above `diskSpaceCleanForciblyRatio`.",
    "deleteFileBatchMax": "Commit-log files one retention pass deletes at most.",
    "deleteCommitLogFilesInterval": "Milliseconds between two deletions of one retention pass.",
    "destroyMapedFileIntervalForcibly": "Milliseconds after which a deleted file still held by a reader is unmapped anyway (readers copy their bytes first, so none is cut short).",
    "enableDLegerCommitLog": "DLedger mode: the commit log is a Raft log shared by `dLegerPeers`; the elected leader is the group's master (id 0, SYNC_MASTER), the others its slaves. `brokerRole` and `brokerId` are ignored. See docs/DLEDGER.md.",
    "dLegerGroup": "DLedger mode: the Raft group's name (empty: brokerName); every peer must use the same.",
    "dLegerPeers": "DLedger mode: every peer of the group, `id-host:port` separated by `;` (e.g. `n0-10.0.0.1:40911;n1-10.0.0.2:40911;n2-10.0.0.3:40911`); the port is the peer port.",
    "dLegerSelfId": "DLedger mode: this broker's id in `dLegerPeers`; it listens on that entry's port.",
    "preferredLeaderId": "DLedger mode: the peer that should lead; a leader hands leadership to it once it has caught up.",
    "heartBeatTimeIntervalMs": "DLedger mode: milliseconds between the leader's heartbeats.",
    "maxHeartBeatLeak": "DLedger mode: heartbeats a follower may miss before it campaigns, and a leader may fail to get answered by a quorum before it steps down.",
    "minVoteIntervalMs": "DLedger mode: lower bound of the random back-off between two votes, in ms.",
    "maxVoteIntervalMs": "DLedger mode: upper bound of that back-off, in ms.",
    "maxPendingRequestsNum": "DLedger mode: appends waiting for a quorum at most; past it a send gets SYSTEM_BUSY at once.",
    "maxWaitAckTimeMs": "DLedger mode: milliseconds a send waits for a quorum before it fails (no SEND_OK).",
    "maxPushTimeOutMs": "DLedger mode: milliseconds after which the leader pushes entries a follower has not acknowledged again.",
    "mappedFileSizeForEntryIndex": "DLedger mode: size in bytes of each entry-index file (a multiple of 32).",
    "dLegerPreVote": "SplitMQ, DLedger mode: a member asks the others before it raises the term, so one that was cut off and comes back cannot depose a healthy leader (DLedger has no pre-vote).",
    "aclEnable": "ACL: every HTTP request must be signed by an account of `aclFile` and hold its endpoint's permission; refusals are NO_PERMISSION (HTTP 403). See docs/SECURITY.md.",
    "aclFile": "ACL: path of the accounts file (TOML, RocketMQ plain_acl field names), re-read within ~1 s of a change; a broken file keeps the last good one.",
    "accessKey": "ACL: the broker's own account; it signs registrations with the nameservers and a slave's metadata sync (an admin account).",
    "secretKey": "ACL: the secret key of `accessKey` (never logged).",
    "aclTimestampToleranceMs": "ACL: milliseconds a signed request's timestamp may differ from the broker's clock; older or later is refused.",
    "aclNonceCacheMax": "ACL: signed requests the replay guard remembers at most within the window; past it new requests get SYSTEM_BUSY.",
    "aclMetricsToken": "ACL: a token that opens `GET /metrics` as `Authorization: Bearer <token>` (scrapers cannot sign); empty: admin only.",
    "aclServerNames": "ACL: `host:port` names (separated by `;`) a client may sign a request for besides the address the connection arrives on and `brokerIP1:listenPort` -- a DNS name or a NAT address clients dial. A signature names its server, so one captured elsewhere is refused.",
    "transactionCheckInterval": "Milliseconds between rounds of the master's transaction check service, which asks producer groups about half messages without an end.",
    "transactionTimeOut": "Milliseconds after its born time before a half (prepared) message is checked back with its producer group.",
    "transactionCheckMax": "Check-backs of one transaction before its half message is moved to `TRANS_CHECK_MAX_TIME_TOPIC` (and logged) instead of checked again.",
    "tlsEnable": "TLS: the HTTP, HA and DLedger peer ports accept TLS only, and the broker's own connections (nameservers, master, peers) use it; every server of the cluster must agree. See docs/SECURITY.md.",
    "tlsCertFile": "TLS: PEM certificate chain of the broker's ports; its subjectAltNames must cover `brokerIP1`/`brokerIP2` (clients verify the address they dial).",
    "tlsKeyFile": "TLS: the private key of `tlsCertFile` (PEM, unencrypted; keep it mode 0600).",
    "tlsCaFile": "TLS: PEM CA the broker verifies nameservers, its master and its DLedger peers against (empty: the system trust store).",
    "tlsPeerClientAuth": "TLS: mutual TLS on the HA and DLedger ports: a connecting peer must present a certificate signed by `tlsCaFile` (brokers present `tlsCertFile`).",
}

@attrs.frozen
class LoadedConfig:
    """A loaded configuration and the keys it did not recognise (to be logged once)."""

    config: BrokerConfig
    unknown_keys: tuple[str, ...]


def _derive_dledger(values: dict[str, Any]) -> None:
    peers = values.get("dleger_peers", ())
    self_id = values.get("dleger_self_id", "")
    if not peers:
        raise ConfigError("enableDLegerCommitLog=true needs dLegerPeers (id-host:port;...)")
    if self_id not in [p for p, _ in peers]:
        raise ConfigError(f"dLegerSelfId={self_id!r} is not one of the dLegerPeers ids "
                          f"{', '.join(p for p, _ in peers)}")
    preferred = values.get("preferred_leader_id", "")
    if preferred and preferred not in [p for p, _ in peers]:
        raise ConfigError(f"preferredLeaderId={preferred!r} is not one of the dLegerPeers ids")
    if values.get("min_vote_interval_ms", 300) >= values.get("max_vote_interval_ms", 1000):
        raise ConfigError("minVoteIntervalMs must be less than maxVoteIntervalMs")
    # The member starts as a follower; the election decides the role (docs/BEHAVIOUR.md 9.8).
    values["broker_role"] = BrokerRole.SLAVE
    values["broker_id"] = -1


#: The pull-answer caps of a slave (``brokerRole=SLAVE``) whose file does not set them, field -> value. A master
#: keeps RocketMQ's (32 messages / 256 KiB hot, 8 / 64 KiB cold). Those caps protect a master: a pull answer is
#: built while writers wait on the same broker, and a cold read's page faults evict the pages its producers and
#: tailing consumers use. A slave in a read/write split takes no client writes and exists to serve exactly the
#: reads that are large and cold (replays, Spark jobs); with RocketMQ's caps each of its answers carries 8 to 32
#: messages and the reader waits a round trip per handful of messages (``benchmarks peers``: 60k msgs/s from a
#: slave with the caps, 241k with these). 1024 messages / 4 MiB, hot or cold, is what the Spark connector and the
#: benchmarks ask per pull (``pullBatchSize`` / ``pullMaxBytes``), so one answer is one pull.
SLAVE_TRANSFER_DEFAULTS: Mapping[str, int] = {
    "max_transfer_count_on_message_in_memory": 1024,
    "max_transfer_bytes_on_message_in_memory": 4 * 1024 * 1024,
    "max_transfer_count_on_message_in_disk": 1024,
    "max_transfer_bytes_on_message_in_disk": 4 * 1024 * 1024,
}


def _derive(values: dict[str, Any], given: set[str]) -> None:
    role = values.get("broker_role", BrokerRole.ASYNC_MASTER)
    if values.get("enable_dleger_commit_log"):
        _derive_dledger(values)  # a member may lead at any time: it keeps a master's caps
    elif role is BrokerRole.SLAVE:
        if values.get("broker_id", 0) <= 0:
            raise ConfigError(f"Slave's brokerId must be > 0 (brokerId={values.get('broker_id', 0)})")
        for field, value in SLAVE_TRANSFER_DEFAULTS.items():
            values.setdefault(field, value)
    else:
        values["broker_id"] = 0  # RocketMQ forces masters to id 0 whatever the file says
    listen = values.get("listen_port", 10911)
    ha = values.get("ha_listen_port", 0) if "ha_listen_port" in given else 0
    if ha <= 0:
        ha = listen + 1 if listen > 0 else 0
    if ha > 65535:
        raise ConfigError(f"haListenPort derived as listenPort+1 = {ha} is not a port; set haListenPort")
    values["ha_listen_port"] = ha
    if "store_path_root_dir" in values:
        values["store_path_root_dir"] = os.path.expanduser(values["store_path_root_dir"])


def config_from_properties(
    props: Mapping[str, str], *, env: Mapping[str, str] | None = None
) -> LoadedConfig:
    """Build the configuration from a property mapping.

    Args:
        props: ``{camelCaseKey: value}`` (file content with overrides applied).
        env: environment for ``NAMESRV_ADDR`` when ``namesrvAddr`` is not given (default ``os.environ``).

    Raises:
        ConfigError: a value does not convert or a role rule is broken; the message names the key.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    unknown: list[str] = []
    for key, raw in props.items():
        spec = KEYS.get(key)
        if spec is None:
            unknown.append(key)
            continue
        field, conv = spec
        values[field] = conv(key, raw.strip())
    if "namesrv_addr" not in values and env.get("NAMESRV_ADDR"):
        values["namesrv_addr"] = _namesrv("NAMESRV_ADDR", env["NAMESRV_ADDR"])
    _derive(values, set(values))
    config = BrokerConfig(**values)
    config.check_derived()
    return LoadedConfig(config, tuple(sorted(unknown)))


def parse_set_options(items: Sequence[str]) -> dict[str, str]:
    """``["key=value", ...]`` (``--set`` options) -> mapping.

    Raises:
        ConfigError: an item without ``=`` or with an empty key.
    """
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r} is not key=value")
        out[key.strip()] = value.strip()
    return out


def load_config(
    path: str | os.PathLike[str] | None,
    overrides: Mapping[str, str] | None = None,
    *,
    env: Mapping[str, str] | None = None,
) -> LoadedConfig:
    """Read a ``.properties`` file (or none), apply overrides, and build the configuration.

    Raises:
        ConfigError: unreadable file, syntax error, bad value (the message names the key and value).
    """
    props: dict[str, str] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read config file {os.fspath(path)}: {e}") from None
        try:
            props = parse_properties(text)
        except PropertiesSyntaxError as e:
            raise ConfigError(f"config file {os.fspath(path)}: {e}") from None
    props.update(overrides or {})
    return config_from_properties(props, env=env)
