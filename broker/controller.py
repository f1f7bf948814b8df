"""The broker process around the store: metadata, processors, HA, registration and background tasks, all in one
asyncio event loop (RocketMQ's ``BrokerController``).

This module only wires: it builds the services and hands each processor of :mod:`broker.processor` the few
collaborators it uses (never the controller itself), then runs the lifecycle.

The append event: the store calls its append listeners once per append, with the new end of the commit log, on
the appending thread (this loop's: sends, send-backs, delayed redeliveries, and a slave's HA client). Subscribed
once at start, in this order: the HA service (an idle slave is sent the new frames from inside the append, so a
SYNC_MASTER round trip starts at once), the dispatch driver (:mod:`broker.dispatch_driver`, the one driver of
dispatch), and on a master the put rate (``putTps``). The store's dispatch listener then wakes the parked
long-polling pulls of each queue that grew and the schedule service.

Background tasks: dispatch, consumer-offset persistence (``flushConsumerOffsetInterval``), delay-offset
persistence, client expiry, registration (``registerNameServerPeriod``, clamped), and on a slave the metadata
sync (``slaveMetadataSyncInterval``, and at once when the master changes). A classic slave that knows no master
(or whose HA link is down) registers again on a short back-off until it does; a DLedger follower's master is its
Raft leader's broker address (:mod:`broker.master_seek`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import attrs
import httpx

from broker.acl import build_gate
from broker.clients import ClientTable, LastPulls
from broker.config import BrokerConfig
from broker.dedup import DuplicateWindow
from broker.dispatch_driver import DispatchDriver
from broker.dledger.config import AppendError, DLedgerConfig
from broker.dledger.election import ElectionTimings
from broker.dledger.member import Role
from broker.dledger.message_store import DLedgerMessageStore
from broker.dledger.roles import RoleHandler
from broker.dledger.server import DLedgerServer
from broker.durability import Durability, DurabilityWaiter, QuorumWait
from broker.group_identity import GroupIdentity
from broker.ha import HAClient, HAService
from broker.ha.api import HAClientAPI, HAServiceAPI
from broker.long_polling import PullHoldService
from broker.master_seek import MasterSeek, after_round, follow_leader, needs_master, on_answer, seek_delay_s
from broker.metadata import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
)
from broker.metadata.topics import SCHEDULE_TOPIC, TIMER_TOPIC
from broker.metrics import BrokerMetrics, BrokerState, RateMeter
from broker.processor.admin import AdminProcessor, StatusViews
from broker.processor.consumer_manager import ConsumerManageProcessor
from broker.processor.pull import PullProcessor
from broker.processor.queue_lock import QueueLockProcessor
from broker.processor.send import SendProcessor
from broker.processor.sendback import SendBackProcessor
from broker.processor.transaction import TransactionProcessor
from broker.rebalance_lock import RebalanceLockTable
from broker.registration import BrokerIdentity, RegisterResult, Registrar, build_register_body
from broker.retention_driver import RetentionDriver
from broker.role import RoleState
from broker.schedule import ScheduleMessageService
from broker.slave_sync import SlaveSynchronizer
from broker.store.api import AppendResult, MessageStore
from broker.store.config import parse_delay_levels
from broker.timer import TimerMessageService
from broker.transaction import HALF_TOPIC, CheckQueues, CheckRules, TransactionalMessageService
from common.codes import BrokerRole
from common.errors import InvalidParameterError, ServiceNotAvailableError
from common.route import TopicConfig
from common.signing import Credentials, SigningAuth, cluster_credentials
from remoting.acl_gate import AclFileWatcher, AclGate
from remoting.router import Router

__all__ = ["BrokerController"]

log = logging.getLogger(__name__)

CLIENT_EXPIRE_CHECK_S = 10.0
#: How often auto-created subscription groups are written to subscriptionGroup.json (the crash-loss window).
GROUPS_PERSIST_INTERVAL_S = 1.0
#: Bound of the whole graceful stop's network part (unregister, HA stop).
STOP_NETWORK_TIMEOUT_S = 5.0
#: How often a classic slave that has its master looks whether its HA link went down (no I/O).
SEEK_IDLE_CHECK_S = 1.0


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class BrokerController:
    """One broker.

    Args:
        config: the broker's configuration.
        store: the message store, loaded and started by the caller.
        addr: the registered client address ``brokerIP1:<bound listen port>``.
        store_host: packed ``addr`` (what the store writes into records; echoed in send replies).
        ha_service / ha_client: injected HA objects (tests); when ``ha_service`` is None, the real
            :class:`broker.ha.HAService` is created, and on a slave the real :class:`broker.ha.HAClient` too.
        clock_ms: wall clock in ms (metadata versions, client expiry).
        http_client: client for nameservers and the master (created and closed here when None).
        rng: randomness of the master re-ask jitter (:mod:`broker.master_seek`).
    """

    def __init__(
        self,
        config: BrokerConfig,
        store: MessageStore,
        *,
        addr: str,
        store_host: bytes,
        ha_service: HAServiceAPI | None = None,
        ha_client: HAClientAPI | None = None,
        clock_ms: Callable[[], int] | None = None,
        http_client: httpx.AsyncClient | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.addr = addr
        self.store_host = store_host
        self.ha_addr = ""
        self._clock_ms = clock_ms or _wall_clock_ms
        self._rng = rng or random.Random()
        self._seek = MasterSeek()
        """A slave's master (client and HA address) and its re-ask back-off (:mod:`broker.master_seek`)."""
        self._leader_addrs: dict[str, str] = {}
        """DLedger mode: each peer's broker address, as its heartbeats as leader announced it."""
        self._seek_wake: asyncio.Event | None = None
        self.role = RoleState(config.broker_role, config.broker_id)
        """The current role and id, read by the processors (DLedger mode: they follow the election)."""
        self.dledger: DLedgerServer | None = None
        self.tls = config.tls_contexts()
        """The TLS contexts with ``tlsEnable`` (HTTP, HA and DLedger ports, outbound calls), else None."""
        cfg_dir = config.config_dir
        self.topics = TopicConfigManager(
            cfg_dir, auto_create_topic_enable=config.auto_create_topic_enable,
            default_topic_queue_nums=config.default_topic_queue_nums,
            delay_level_count=len(config.message_delay_level.split()),
            max_auto_create=config.max_auto_create_topics, clock_ms=self._clock_ms,
        )
        self.offsets = ConsumerOffsetManager(cfg_dir, clock_ms=self._clock_ms)
        self.groups = SubscriptionGroupManager(cfg_dir, auto_create=config.auto_create_subscription_group,
                                               max_auto_create=config.max_auto_create_subscription_groups,
                                               clock_ms=self._clock_ms)
        self.delay_offsets = DelayOffsetManager(cfg_dir)
        self.group_identity = GroupIdentity(cfg_dir, config.broker_name, clock_ms=self._clock_ms)
        """The id of this group's store that readers keep with their offsets (:mod:`broker.group_identity`)."""
        self.clients = ClientTable(clock_ms=self._clock_ms)
        self.last_pulls = LastPulls()
        self.hold = PullHoldService(config.max_parked_pulls)
        self.queue_locks = RebalanceLockTable(self._clock_ms)
        # A DLedger member's id and role follow the election: its series are labelled by its peer id instead.
        node_id, node_type = ((f"{config.broker_name}-{config.dleger_self_id}", "DLEDGER")
                              if config.enable_dleger_commit_log else
                              (f"{config.broker_name}-{config.broker_id}", self.role_name))
        self.metrics = BrokerMetrics(config.broker_cluster_name, node_id, node_type, self.metrics_state)
        self.put_rate = RateMeter(clock_ms=self._clock_ms)
        self.dispatch = DispatchDriver(store)
        self.retention = RetentionDriver(
            store.cleaner, self.offsets.table, interval_s=config.clean_resource_interval_ms / 1000.0,
            delete_interval_s=config.delete_commit_log_files_interval_ms / 1000.0,
            batch_max=config.delete_file_batch_max,
        )
        if ha_service is None:
            ha_config = config.to_ha_config()
            if self.tls is not None:
                ha_config = attrs.evolve(ha_config, tls_server=self.tls.peer_server, tls_client=self.tls.client)
            ha_service = HAService(store, ha_config)
            if config.is_slave and ha_client is None and not config.enable_dleger_commit_log:
                ha_client = HAClient(store, ha_config, config.ha_master_address,
                                     max_record_bytes=config.max_message_size)
        self.ha_service: HAServiceAPI = ha_service
        self.ha_client: HAClientAPI | None = ha_client
        self.dledger_roles: RoleHandler | None = None
        self.dedup = (DuplicateWindow(config.duplicate_window_ms, config.duplicate_window_max_keys,
                                      clock_ms=self._clock_ms) if config.duplicate_window_ms > 0 else None)
        """The duplicate window of idempotent sends (None with ``duplicateWindowMs=0``): filled from the log when
        the broker becomes a master (:meth:`rebuild_dedup`), emptied when it stops being one."""
        self.durability: Durability
        if config.enable_dleger_commit_log:
            self._build_dledger()
        else:
            self.durability = DurabilityWaiter(
                flush_disk_type=config.flush_disk_type, broker_role=config.broker_role,
                sync_flush_timeout_ms=config.sync_flush_timeout_ms, flush_future=store.flush_future,
                replicas=ha_service,
            )
        self._own_http = http_client is None
        # The broker's own account signs its calls to the nameservers and to its master (a refused signature
        # there is a 403 in the registration or sync log, never a silent unsigned call).
        # With haAuthSecret and no account of its own, the broker signs as the cluster account (derived from the
        # secret): a nameserver that knows the secret refuses unsigned registrations (issue 39).
        creds = (Credentials(config.access_key, config.secret_key) if config.access_key else
                 cluster_credentials(config.ha_auth_secret.encode()) if config.ha_auth_secret else None)
        auth = SigningAuth(creds) if creds is not None else None
        self.http = http_client or httpx.AsyncClient(timeout=config.register_broker_timeout_ms / 1000.0, auth=auth,
                                                     verify=self.tls.client if self.tls is not None else True)
        self._scheme = "https" if self.tls is not None else "http"
        self.acl_gate: AclGate | None = None
        """The ACL hook of the router (None when ``aclEnable=false``: no check runs per request)."""
        if config.acl_enable:
            self.acl_gate = build_gate(acl_file=config.acl_file, tolerance_ms=config.acl_timestamp_tolerance_ms,
                                       nonce_cache_max=config.acl_nonce_cache_max,
                                       metrics_token=config.acl_metrics_token, clock_ms=self._clock_ms,
                                       server_names=(addr, *config.acl_server_names))
        self.registrar: Registrar | None = None
        self.slave_sync: SlaveSynchronizer | None = None
        self.schedule = ScheduleMessageService(
            store, self.delay_offsets, delay_levels_ms=parse_delay_levels(config.message_delay_level),
            clock_ms=self._clock_ms, journal_path=cfg_dir / "delayDelivery.json", on_put=self._on_schedule_put,
        )
        self.timer: TimerMessageService | None = None
        if config.timer_wheel_enable:
            self.timer = TimerMessageService(
                store, clock_ms=self._clock_ms, progress_path=cfg_dir / "timerProgress.json",
                window_ms=config.timer_roll_window_slot * 1000, max_entries=config.timer_max_in_memory,
                on_put=self._on_schedule_put)
        self.transactions = TransactionalMessageService(
            store, self.offsets, CheckQueues(),
            rules=CheckRules(timeout_ms=config.transaction_time_out_ms, check_max=config.transaction_check_max),
            interval_ms=config.transaction_check_interval_ms, clock_ms=self._clock_ms, store_host=self.store_host,
            catch_up_dispatch=self.dispatch.catch_up, on_put=self._on_schedule_put)
        self.router = self._build_router()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._tasks: list[asyncio.Task[Any]] = []
        self._register_task: asyncio.Task[Any] | None = None
        self._register_wanted = False
        self._started = False
        self._stopped = False

    def _build_dledger(self) -> None:
        """DLedger mode: the member on the store's log, the quorum wait, the role-change handler."""
        cfg, store = self.config, self.store
        if not isinstance(store, DLedgerMessageStore):
            raise TypeError("enableDLegerCommitLog=true needs the DLedger message store")
        timings = ElectionTimings(heartbeat_interval_ms=cfg.heart_beat_time_interval_ms,
                                  max_heartbeat_leak=cfg.max_heart_beat_leak,
                                  min_vote_interval_ms=cfg.min_vote_interval_ms,
                                  max_vote_interval_ms=cfg.max_vote_interval_ms)
        dledger_config = DLedgerConfig(
            group=cfg.dledger_group, self_id=cfg.dleger_self_id, peers=dict(cfg.dleger_peers), timings=timings,
            pre_vote=cfg.dleger_pre_vote, max_pending=cfg.max_pending_requests_num,
            max_wait_ack_ms=cfg.max_wait_ack_time_ms, max_push_timeout_ms=cfg.max_push_time_out_ms,
            preferred_leader_id=cfg.preferred_leader_id or None, auth_secret=cfg.ha_auth_secret.encode(),
            loopback_only=not cfg.peer_port_open, broker_addr=self.addr,
            tls_server=self.tls.peer_server if self.tls is not None else None,
            tls_client=self.tls.client if self.tls is not None else None)
        roles = self.dledger_roles = RoleHandler(
            role=self.role, follower_id=cfg.dledger_broker_id,
            leading=lambda term: self.dledger is not None and self.dledger.leads(term),
            caught_up=lambda: self.dispatch.catch_up() and store.ledger_caught_up,
            set_store_role=self._set_store_role,
            become_master=self._became_master, become_slave=self._became_slave)
        def role_changed(role: Role, term: int, leader_id: str | None) -> None:
            roles.changed(role, term, leader_id)
            self._follow_leader()

        node = self.dledger = DLedgerServer(dledger_config, store.ledger, on_role_change=role_changed,
                                            on_commit=store.committed_moved, on_leader_addr=self._leader_announced)
        store.attach(node)
        store.add_append_listener(lambda _end: roles.poke())
        self.durability = QuorumWait(group=cfg.dledger_group, max_wait_ack_ms=cfg.max_wait_ack_time_ms)

    def _set_store_role(self, role: BrokerRole) -> None:
        """DLedger mode: the store's role, and the duplicate window of the new role. A leader that caught up (every
        entry of its log committed, none the clients were acknowledged missing) fills the window from its log
        before it takes its first send; a follower empties it."""
        if role is BrokerRole.SLAVE:
            if self.dedup is not None:
                self.dedup.clear()
        else:
            self.rebuild_dedup()
        self.store.set_broker_role(role)  # type: ignore[attr-defined]  # the DLedger store (checked at build)

    def rebuild_dedup(self) -> int:
        """Fill the duplicate window from the idempotent records of the log within ``duplicateWindowMs`` (the
        broker becomes a master); returns the keys found."""
        dedup = self.dedup
        if dedup is None:
            return 0
        t0 = time.monotonic()
        found = dedup.rebuild(self.store.idempotent_keys(dedup.since_ms()))
        log.info("duplicate window rebuilt from the log: %d keys of the last %d ms in %.0f ms", found,
                 dedup.window_ms, (time.monotonic() - t0) * 1000)
        return found

    # --- the master of a slave (broker.master_seek) ----------------------------------------------------------

    @property
    def master_addr(self) -> str | None:
        """A slave's master client address: a classic slave's from the last registration answer, a DLedger
        follower's its Raft leader's (None pauses the metadata sync)."""
        return self._seek.master_addr

    @master_addr.setter
    def master_addr(self, addr: str | None) -> None:
        self._seek = attrs.evolve(self._seek, master_addr=addr)

    def _leader_announced(self, peer: str, broker_addr: str) -> None:
        """DLedger mode: a heartbeat of ``peer`` as leader gave its broker address."""
        self._leader_addrs[peer] = broker_addr
        self._follow_leader()

    def _follow_leader(self) -> None:
        """DLedger mode: the master is the broker address of the Raft leader this member follows; a new one runs
        the metadata sync at once."""
        node = self.dledger
        if node is None:
            return
        st = node.state
        addr, sync_now = follow_leader(self.master_addr, following=st.role is Role.FOLLOWER, leader_id=st.leader_id,
                                       leader_addrs=self._leader_addrs)
        if addr != self.master_addr:
            log.info("master of %s is now %s (DLedger leader %s, term %d)", self.config.broker_name, addr,
                     st.leader_id, st.term)
        self.master_addr = addr
        if sync_now and self.slave_sync is not None:
            self.slave_sync.kick()

    def _link_up(self) -> bool:
        return self.ha_client is not None and bool(self.ha_client.is_connected)

    def _seeking(self) -> bool:
        return self.role.is_slave and needs_master(self._seek, link_up=self._link_up(),
                                                   fixed_ha=bool(self.config.ha_master_address))

    async def _seek_master(self) -> None:
        """Classic slave: while it knows no master or its HA link is down, register again on a short back-off
        (the answer names the master) instead of waiting for the registration period."""
        assert self._seek_wake is not None
        while True:
            if not self._seeking():
                self._seek = after_round(self._seek, still_needed=False)
                self._seek_wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._seek_wake.wait(), SEEK_IDLE_CHECK_S)
                continue
            await asyncio.sleep(seek_delay_s(self._seek.misses, self._rng.random()))
            if self._seeking():  # a periodic round may have found the master meanwhile
                log.debug("slave %s: no master (or HA link down); asking the nameservers again",
                          self.config.broker_name)
                await self._register_quietly()
                self._seek = after_round(self._seek, still_needed=self._seeking())

    async def _became_master(self) -> None:
        self.master_addr = None
        self._mint_group_identity()
        await self.schedule.start()
        if self.timer is not None:
            await self.timer.start()
        await self.transactions.start()
        self._set_registered_id()
        await self.register_now()

    async def _became_slave(self) -> None:
        await self.schedule.stop()
        if self.timer is not None:
            await self.timer.stop()
        self.queue_locks.clear()  # locks live on the master only; the next master starts empty
        await self.transactions.stop()
        self._set_registered_id()
        self.request_registration()

    def _set_registered_id(self) -> None:
        if self.registrar is not None:
            self.registrar.identity = attrs.evolve(self.registrar.identity, broker_id=self.role.broker_id)

    def _build_router(self) -> Router:
        """The processors, each given what it touches, and their routes."""
        cfg, addr, store = self.config, self.addr, self.store
        topics, groups, metrics = self.topics, self.groups, self.metrics
        send = SendProcessor(cfg, addr=addr, store_host=self.store_host, store=store, topics=topics, groups=groups,
                             metrics=metrics, durability=self.durability,
                             request_registration=self.request_registration, role=self.role,
                             clock_ms=self._clock_ms,
                             half_item=TransactionalMessageService.half_item, half_topic=HALF_TOPIC,
                             dedup=self.dedup,
                             entry_committed=store.entry_committed if isinstance(store, DLedgerMessageStore)
                             else None)
        pull = PullProcessor(cfg, addr=addr, store=store, topics=topics, groups=groups, offsets=self.offsets,
                             hold=self.hold, catch_up_dispatch=self.dispatch.catch_up,
                             master_link_up=self.master_link_up, last_pulls=self.last_pulls, metrics=metrics,
                             clock_ms=self._clock_ms, role=self.role)
        send_back = SendBackProcessor(cfg, addr=addr, store=store, topics=topics, groups=groups, metrics=metrics,
                                      durability=self.durability, request_registration=self.request_registration,
                                      role=self.role)
        consumers = ConsumerManageProcessor(cfg, addr=addr, clients=self.clients, offsets=self.offsets,
                                            last_pulls=self.last_pulls, topics=topics, groups=groups,
                                            request_registration=self.request_registration, clock_ms=self._clock_ms,
                                            role=self.role)
        admin = AdminProcessor(cfg, addr=addr, store=store, catch_up_dispatch=self.dispatch.catch_up, topics=topics,
                               groups=groups, offsets=self.offsets, delay_offsets=self.delay_offsets,
                               register_now=self.register_now, clean_now=self._clean_now,
                               status=StatusViews(self.runtime_info, self.ha_status, self.metrics_text,
                                                  self.dledger_status if self.dledger else None,
                                                  self._transfer_leadership if self.dledger else None,
                                                  self.group_identity.to_json))
        queue_locks = QueueLockProcessor(cfg, addr=addr, role=self.role, table=self.queue_locks)
        transactions = TransactionProcessor(self.transactions, durability=self.durability, role=self.role,
                                            broker_name=cfg.broker_name, addr=addr,
                                            permission=lambda: cfg.broker_permission)
        routes = {("POST", "/send"): send.handle, ("GET", "/pull"): pull.handle, **send_back.routes(),
                  **consumers.routes(), **admin.routes(), **queue_locks.routes(), **transactions.routes()}
        return Router(routes, max_body_bytes=cfg.max_request_body_bytes,
                      max_inflight_body_bytes=max(cfg.max_inflight_request_body_bytes, cfg.max_request_body_bytes),
                      identity=lambda: (self.addr, self.role_name),
                      observe=metrics.observe_request, authorize=self.acl_gate)

    # --- identity ---------------------------------------------------------------------------------------

    @property
    def role_name(self) -> str:
        """The role answers and status pages show. A DLedger master that stopped leading (or is handing over)
        says SLAVE at once, before its role handler runs, so a client that meets its refusal looks for the new
        leader."""
        if self.dledger is not None and not self.role.is_slave and not self.dledger.accepting_appends:
            return "SLAVE"
        return self.role.name

    def now_ms(self) -> int:
        """The broker's wall clock (injected in tests)."""
        return self._clock_ms()

    def master_link_up(self) -> bool:
        """On a slave: whether the HA link to the master is connected (decision 6); in DLedger mode, whether a
        leader is known (the follower hears from it)."""
        if self.dledger is not None:
            return self.dledger.state.leader_id is not None
        return self.ha_client is not None and bool(self.ha_client.is_connected)

    # --- lifecycle --------------------------------------------------------------------------------------

    def load_metadata(self) -> None:
        """Read the JSON metadata files (each falls back to its ``.bak``)."""
        for manager in (self.topics, self.offsets, self.groups, self.delay_offsets):
            manager.load()
        self.group_identity.load()

    def _mint_group_identity(self) -> None:
        """As master: make sure the group has an identity (a failed write is retried at the next start)."""
        try:
            self.group_identity.ensure_minted()
        except OSError as e:
            log.error("cannot persist the group identity of %s (readers cannot check their offsets against this "
                      "store until it is): %s", self.config.broker_name, e)

    async def start(self, *, dledger_sock: socket.socket | None = None, ha_sock: socket.socket | None = None
                    ) -> None:
        """Load metadata, hook the store, start HA (listening on ``ha_sock`` when given, else on ``haListenPort``;
        or the DLedger member, listening on ``dledger_sock`` when given, else on its ``dLegerPeers`` port) and the
        background tasks (registration runs in the background: an unreachable nameserver never delays serving).

        Raises:
            RuntimeError: started twice.
            OSError: the HA port cannot be bound.
        """
        if self._started:
            raise RuntimeError("BrokerController already started")
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self.load_metadata()
        cfg = self.config
        store = self.store
        dledger = self.dledger
        if self.acl_gate is not None:
            self._spawn(AclFileWatcher(cfg.acl_file, self.acl_gate.update).run(), "acl-watch")
        for warning in cfg.protected_mode_warnings():
            log.warning("%s", warning)
        if dledger is None:
            store.add_append_listener(lambda _end: self.ha_service.notify_new_data())
        store.add_append_listener(self.dispatch.wake)
        if not cfg.is_slave or dledger is not None:  # a slave's appends are replication, shown by /ha
            store.add_append_listener(lambda _end: self.put_rate.add(1))
        store.add_dispatch_listener(self._on_dispatch)
        self._spawn(self.dispatch.run(), "dispatch")
        self._spawn(self.retention.run(), "retention")
        if not cfg.is_slave:
            if dledger is None:
                self.rebuild_dedup()  # before the first send: a retry of a send the crash left unanswered is known
            self._mint_group_identity()
            await self.schedule.start()  # only a master redelivers delayed messages (docs/BEHAVIOUR.md 8.2)
            if self.timer is not None:
                await self.timer.start()
            await self.transactions.start()  # and checks half messages back
        if dledger is None:
            ha_port = await self.ha_service.start(cfg.bind_host, cfg.ha_listen_port, ha_sock)
            self.ha_addr = f"{cfg.ha_ip}:{ha_port}"
        if self.ha_client is not None:
            await self.ha_client.start()
        identity = self._identity()
        self.registrar = Registrar(cfg.namesrv_addr, identity, self._register_body,
                                   timeout_s=cfg.register_broker_timeout_ms / 1000.0,
                                   on_result=self._on_register_result, client=self.http, scheme=self._scheme)
        self._spawn(self._periodic(cfg.flush_consumer_offset_interval_ms / 1000.0, self.offsets.persist_if_dirty),
                    "persist-offsets")
        self._spawn(self._periodic(cfg.flush_delay_offset_interval_ms / 1000.0, self._persist_delay), "persist-delay")
        self._spawn(self._periodic(CLIENT_EXPIRE_CHECK_S, self.clients.expire), "expire-clients")
        # Auto-created subscription groups are written at most once a second, not once per new group.
        self._spawn(self._periodic(GROUPS_PERSIST_INTERVAL_S, self.groups.persist_if_dirty), "persist-groups")
        if cfg.namesrv_addr and dledger is None:
            self.request_registration()
            self._spawn(self.registrar.run_periodic(cfg.register_period_ms / 1000.0), "register")
        elif cfg.namesrv_addr:  # the role handler registers once the election says which id this broker has
            self._spawn(self._periodic(cfg.register_period_ms / 1000.0, self.request_registration), "register")
        if cfg.is_slave:
            self.slave_sync = SlaveSynchronizer(
                master_addr=lambda: self.master_addr if self.role.is_slave else None, own_addr=self.addr,
                topics=self.topics, offsets=self.offsets, groups=self.groups, delay_offsets=self.delay_offsets,
                client=self.http, scheme=self._scheme, identity=self.group_identity,
            )
            self._spawn(self.slave_sync.run_periodic(cfg.slave_metadata_sync_interval_ms / 1000.0), "slave-sync")
            if dledger is None and cfg.namesrv_addr:
                self._seek_wake = asyncio.Event()
                self._spawn(self._seek_master(), "seek-master")
        if dledger is not None:
            await dledger.start(cfg.bind_host, sock=dledger_sock)
        log.info("broker %s id=%d role=%s serving at %s, HA at %s", cfg.broker_name, self.role.broker_id,
                 self.role_name, self.addr, self.ha_addr)

    async def stop(self) -> None:
        """Graceful stop: wake parked pulls, stop tasks, unregister, stop HA, persist metadata, shut the store
        down. Idempotent; the network part is bounded by ``STOP_NETWORK_TIMEOUT_S``."""
        if self._stopped:
            return
        self._stopped = True
        self.hold.close()
        self.transactions.checks.close()
        tasks = [*self._tasks, *([self._register_task] if self._register_task else [])]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.dledger_roles is not None:
            await self.dledger_roles.stop()
        if self.dledger is not None:
            await self.dledger.stop()
        await self.schedule.stop()
        if self.timer is not None:
            await self.timer.stop()
        await self.transactions.stop()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop_network(), STOP_NETWORK_TIMEOUT_S)
        self._persist_all()
        if self._own_http:
            await self.http.aclose()
        self.store.shutdown()
        log.info("broker %s id=%d stopped", self.config.broker_name, self.role.broker_id)

    async def _stop_network(self) -> None:
        if self.registrar is not None and self.config.namesrv_addr:
            await self.registrar.unregister_all()
        if self.ha_client is not None:
            await self.ha_client.stop()
        await self.ha_service.stop()

    def _persist_all(self) -> None:
        for name, persist in (("consumer offsets", self.offsets.persist), ("topics", self.topics.persist),
                              ("subscription groups", self.groups.persist),
                              ("delay offsets", self.delay_offsets.persist)):
            try:
                persist()
            except OSError as e:
                log.error("cannot persist %s at shutdown: %s", name, e)

    def _persist_delay(self) -> None:
        if self.delay_offsets.dirty:
            self.delay_offsets.persist()

    def _spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> None:
        self._tasks.append(asyncio.get_running_loop().create_task(coro, name=f"broker-{name}"))

    async def _periodic(self, period_s: float, fn: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(period_s)
            try:
                fn()
            except Exception:  # one failed round (disk full...) must not end the schedule
                log.exception("periodic task %s failed", getattr(fn, "__name__", fn))

    # --- dispatch ---------------------------------------------------------------------------------------

    def _in_loop(self, fn: Callable[[], None]) -> None:
        if threading.get_ident() == self._loop_thread:
            fn()
        elif self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(fn)

    def _on_dispatch(self, topic: str, queue_id: int, max_queue_offset: int) -> None:
        if topic == SCHEDULE_TOPIC:
            self.schedule.notify_dispatched(queue_id, max_queue_offset)
        elif topic == TIMER_TOPIC and self.timer is not None:
            self.timer.notify_dispatched(queue_id, max_queue_offset)
        self._in_loop(lambda: self.hold.notify(topic, queue_id, max_queue_offset))

    def _on_schedule_put(self, topic: str, result: AppendResult) -> None:
        self.metrics.stored(topic, result.msg_count, result.wrote_bytes)

    # --- registration -----------------------------------------------------------------------------------

    def _register_body(self) -> dict[str, Any]:
        table: dict[str, TopicConfig] = self.topics.table()
        return build_register_body(self.registrar.identity if self.registrar else self._identity(), table,
                                   self.topics.data_version, self.config.broker_permission)

    def _identity(self) -> BrokerIdentity:
        cfg = self.config
        return BrokerIdentity(cfg.broker_cluster_name, cfg.broker_name, self.role.broker_id, self.addr, self.ha_addr)

    def _on_register_result(self, result: RegisterResult) -> None:
        if not self.role.is_slave or self.dledger is not None:
            return  # a DLedger follower's master is its Raft leader (_follow_leader), never the nameserver's
        seek, sync_now = on_answer(self._seek, result)
        if seek.master_addr != self.master_addr:
            log.info("master of %s is now %s (HA %s)", self.config.broker_name, result.master_addr,
                     result.ha_server_addr)
        self._seek = seek
        if self.ha_client is not None and not self.config.ha_master_address and result.ha_server_addr:
            self.ha_client.update_master_address(result.ha_server_addr)
        if sync_now and self.slave_sync is not None:
            self.slave_sync.kick()
        if self._seek_wake is not None:
            self._seek_wake.set()

    def request_registration(self) -> None:
        """Register soon, in the background. A request during a round schedules one more round after it, so
        the change that asked is always in a registration that starts later."""
        if self.registrar is None or not self.config.namesrv_addr or self._stopped:
            return
        if self.role.broker_id < 0:
            return  # DLedger mode before the first election: the id is not known yet
        self._register_wanted = True
        if self._register_task is not None and not self._register_task.done():
            return
        self._register_task = asyncio.get_running_loop().create_task(self._register_pending())

    async def _register_pending(self) -> None:
        while self._register_wanted and not self._stopped:
            self._register_wanted = False
            await self._register_quietly()

    async def _register_quietly(self) -> None:
        try:
            if self.registrar is not None:
                await self.registrar.register_all()
        except Exception:
            log.exception("registration failed")

    async def register_now(self) -> None:
        """Register and wait for the round (bounded by ``registerBrokerTimeoutMills``); used after a topic
        change so the route is visible when the admin call returns."""
        if self.registrar is not None and self.config.namesrv_addr and not self._stopped:
            await self._register_quietly()

    # --- status -----------------------------------------------------------------------------------------

    def metrics_text(self) -> bytes:
        """``GET /metrics``: the Prometheus text, with the gauges read now."""
        self.metrics.parked_pulls.set(self.hold.parked_count)
        self.metrics.commitlog_max_offset.set(self.store.max_physical_offset)
        return self.metrics.render()

    def metrics_state(self) -> BrokerState:
        """What ``GET /metrics`` reads at scrape time (consumer lag from committed offsets and queue ends)."""
        store = self.store
        cleaner = store.cleaner
        usage = cleaner.usage
        max_offsets = store.topic_queue_max_offsets()
        lag: dict[tuple[str, str], int] = {}
        for key, queues in self.offsets.table().items():
            topic, _, group = key.partition("@")
            lag[(group, topic)] = sum(max(0, max_offsets.get((topic, q), 0) - off) for q, off in queues.items())
        return BrokerState(
            storage_size_bytes=store.max_physical_offset - store.min_physical_offset,
            flush_behind_bytes=store.max_physical_offset - store.flushed_physical_offset,
            dispatch_behind_bytes=store.dispatch_behind_bytes,
            consumer_lag=lag,
            ha=self.ha_service.status(),
            commitlog_min_offset=store.min_physical_offset,
            disk_used_ratio={"commitlog": usage.commitlog, "consumequeue": usage.consume_queue, "index": usage.index},
            store_writeable=cleaner.writeable,
            retention_files_deleted=cleaner.stats.files_deleted,
            retention_bytes_reclaimed=cleaner.stats.bytes_reclaimed,
            dledger=self.dledger.status() if self.dledger is not None else None,
            dedup=self.dedup_status(),
        )

    async def _clean_now(self) -> dict[str, Any]:
        return (await self.retention.clean_now()).to_json()

    def runtime_info(self) -> dict[str, Any]:
        cfg = self.config
        store = self.store
        cleaner = store.cleaner
        usage = cleaner.usage
        return {
            "clusterName": cfg.broker_cluster_name,
            "brokerName": cfg.broker_name,
            "brokerId": self.role.broker_id,
            "role": self.role_name,
            "addr": self.addr,
            "haAddr": self.ha_addr,
            "flushDiskType": cfg.flush_disk_type.value,
            "slaveReadEnable": cfg.slave_read_enable,
            "enablePropertyFilter": cfg.enable_property_filter,
            "groupIdentity": self.group_identity.value,
            "brokerPermission": cfg.broker_permission,
            "commitLogMaxOffset": store.max_physical_offset,
            "commitLogMinOffset": store.min_physical_offset,
            "flushedOffset": store.flushed_physical_offset,
            "dispatchBehindBytes": store.dispatch_behind_bytes,
            "memoryForReadsBytes": store.memory_bytes_for_reads,
            "storeWriteable": cleaner.writeable,
            "storeNotWriteableReason": cleaner.state.reason,
            "diskUsedRatio": {"commitLog": usage.commitlog, "consumeQueue": usage.consume_queue,
                              "index": usage.index},
            "retentionFilesDeleted": cleaner.stats.files_deleted,
            "retentionBytesReclaimed": cleaner.stats.bytes_reclaimed,
            "putTps": self.put_rate.per_second(),
            "parkedPulls": self.hold.parked_count,
            "transactions": self.transactions.status(),
            "topicCount": len(self.topics),
            "masterAddr": self.master_addr,
            "masterLinkUp": self.master_link_up() if self.role.is_slave else None,
            "namesrvAddr": ";".join(cfg.namesrv_addr),
            "registrationRounds": self.registrar.rounds if self.registrar else 0,
            "slaveSyncRounds": self.slave_sync.rounds if self.slave_sync else 0,
            "dledger": self.dledger.status() if self.dledger is not None else None,
            "duplicateWindow": self.dedup_status(),
        }

    def dedup_status(self) -> dict[str, int] | None:
        """The duplicate window's figures (None when ``duplicateWindowMs=0``)."""
        d = self.dedup
        if d is None:
            return None
        return {"windowMs": d.window_ms, "maxKeys": d.max_keys, "keys": d.size, "duplicates": d.duplicates,
                "evictedEarly": d.evicted_early, "rebuiltKeys": d.rebuilt}

    def dledger_status(self) -> dict[str, Any]:
        """``GET /dledger``: the member's status and the broker's role and id."""
        assert self.dledger is not None
        status = dict(self.dledger.status())
        status.update(brokerName=self.config.broker_name, brokerId=self.role.broker_id, brokerRole=self.role_name,
                      addr=self.addr)
        return status

    async def _transfer_leadership(self, peer: str, timeout_s: float) -> dict[str, Any]:
        assert self.dledger is not None
        try:
            await self.dledger.transfer_leadership(peer, timeout_s)
        except ValueError as e:
            raise InvalidParameterError(str(e)) from None
        except AppendError as e:
            raise ServiceNotAvailableError(f"leadership transfer of {self.config.broker_name} to {peer}: {e}") from None
        return self.dledger_status()

    def ha_status(self) -> dict[str, Any]:
        """``GET /ha``: identity, the HA service's status and, on a slave, the HA client's under ``client``."""
        cfg = self.config
        status: dict[str, Any] = {"brokerName": cfg.broker_name, "brokerId": self.role.broker_id, "role": self.role_name,
                                  "haAddr": self.ha_addr}
        status.update(self.ha_service.status())
        status["client"] = self.ha_client.status() if self.ha_client is not None else None
        return status
