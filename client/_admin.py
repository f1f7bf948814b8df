"""``Admin``: topics, subscription groups, cluster, HA and DLedger status, leadership transfer, consumer progress,
message queries (mqadmin).

Control-plane calls go to the nameservers (one at a time, failing over) and to brokers' masters; reads that a
slave can answer (offsets, messages) fall back to a slave when the master does not answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import attrs
import httpx

from client import _requests as rq
from client._instance import ClientConfig, ClientInstance, ClientState, with_credentials
from common import codec
from common.codes import MASTER_ID, MAX_TRANSFER_TIMEOUT_MS, Perm
from common.errors import (
    BrokerNotFoundError,
    ClientClosedError,
    ClientError,
    InvalidParameterError,
    QueryNotFoundError,
    RequestTimeoutError,
    ServiceNotAvailableError,
    TlsError,
)
from common.message import MessageExt, MessageQueue
from common.properties import validate_group, validate_topic
from common.route import BrokerData, TopicConfig, TopicRouteData
from common.signing import Credentials

__all__ = ["Admin", "ClusterInfo", "QueueProgress"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@attrs.frozen
class ClusterInfo:
    """The nameserver's view of the brokers (``GET /cluster``)."""

    broker_addr_table: Mapping[str, BrokerData]
    """Broker group name -> its members."""
    cluster_addr_table: Mapping[str, tuple[str, ...]]
    """Cluster name -> broker group names."""
    broker_live_table: Mapping[str, Mapping[str, Any]]
    """Member address -> ``{"lastUpdateTimestamp", "haServerAddr"}``."""

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ClusterInfo:
        return cls(
            {name: BrokerData.from_json(bd) for name, bd in dict(d.get("brokerAddrTable") or {}).items()},
            {c: tuple(sorted(names)) for c, names in dict(d.get("clusterAddrTable") or {}).items()},
            dict(d.get("brokerLiveTable") or {}),
        )

    def master_addrs(self, cluster: str | None = None) -> dict[str, str]:
        """``{broker_name: master addr}`` of the groups (of ``cluster``) that have a master."""
        names = self.cluster_addr_table.get(cluster, ()) if cluster is not None else self.broker_addr_table.keys()
        out = {}
        for name in sorted(names):
            bd = self.broker_addr_table.get(name)
            if bd is not None and bd.master_addr:
                out[name] = bd.master_addr
        return out


@attrs.frozen
class QueueProgress:
    """One queue's consumption progress (``mqadmin consumerProgress``)."""

    message_queue: MessageQueue
    broker_offset: int
    """The queue's max offset on the broker."""
    consumer_offset: int
    """The group's committed offset (-1 when never committed)."""
    lag: int
    """Messages not yet consumed: ``broker_offset - max(consumer_offset, 0)``."""
    last_pull_broker_id: int | None = None
    """The member of the broker group that served the group's newest pull of this queue (0 = master), from the
    brokers' memory since they started; None when none of them saw a pull."""


class Admin:
    """Administration of a SplitMQ cluster.

    Args:
        namesrv_addr: nameservers, ``;``-separated.
        client_config: settings of the shared client instance (used when this admin creates it).
        credentials: the account that signs every request (an ``admin`` one for topic and group administration).
    """

    def __init__(self, namesrv_addr: str, *, client_config: ClientConfig | None = None,
                 credentials: Credentials | None = None) -> None:
        self._client: ClientInstance | None = ClientInstance.acquire(
            namesrv_addr, with_credentials(client_config, credentials))
        self._state = ClientState.OPENED

    @property
    def client(self) -> ClientInstance:
        if self._state is not ClientState.OPENED or self._client is None:
            raise ClientClosedError("admin is closed")
        return self._client

    def __enter__(self) -> Admin:
        if self._state is ClientState.CLOSED:
            raise ClientClosedError("admin is closed; create a new one")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Release the client instance. Idempotent."""
        if self._state is ClientState.CLOSED:
            return
        self._state = ClientState.CLOSED
        if self._client is not None:
            self._client.release()

    # --- nameserver ---

    def _namesrv_get(self, path: str) -> dict[str, Any]:
        client = self.client
        unreachable: dict[str, ClientError] = {}
        for addr in client.nameservers.rotation():
            try:
                obj = rq.json_of(client.http.get(f"http://{addr}{path}"), addr)
            except httpx.HTTPError as e:
                unreachable[addr] = rq.map_transport_error(e, addr, f"nameserver {addr} {path}")
                if isinstance(unreachable[addr], TlsError):
                    raise unreachable[addr] from None  # a setting to fix: the other nameservers would say the same
                continue
            client.nameservers.settle(addr)
            return obj
        raise rq.nameservers_unavailable(unreachable)

    def cluster_info(self) -> ClusterInfo:
        """Brokers and clusters as the nameserver knows them."""
        return ClusterInfo.from_json(self._namesrv_get("/cluster"))

    def topic_route(self, topic: str) -> TopicRouteData:
        """The nameserver's route of ``topic`` (also refreshes the client's cache).

        Raises:
            RouteNotFoundError: no nameserver knows the topic.
        """
        validate_topic(topic)
        client = self.client
        client.update_topic_route_from_nameserver(topic)
        route = client.routes.route(topic)
        if route is None or not route.queue_datas:
            raise client.no_route_error(topic)
        return route

    def topic_list(self) -> list[str]:
        """Topics the nameserver knows."""
        return sorted(self._namesrv_get("/topics").get("topicList", []))

    # --- topics and groups ---

    def _target_masters(self, cluster: str | None, broker_name: str | None) -> dict[str, str]:
        info = self.cluster_info()
        if broker_name is not None:
            masters = {k: v for k, v in info.master_addrs().items() if k == broker_name}
            if not masters:
                raise BrokerNotFoundError(f"The broker[{broker_name}] not exist (or has no master)")
            return masters
        if cluster is not None and cluster not in info.cluster_addr_table:
            raise InvalidParameterError(f"cluster {cluster!r} is unknown to the nameserver")
        masters = info.master_addrs(cluster)
        if not masters:
            raise BrokerNotFoundError("no master broker is registered with the nameserver")
        return masters

    def create_topic(self, topic: str, *, queue_nums: int = 4, cluster: str | None = None,
                     broker_name: str | None = None, read_queue_nums: int | None = None,
                     write_queue_nums: int | None = None, perm: int = int(Perm.READ | Perm.WRITE),
                     timeout_s: float = 10.0) -> list[str]:
        """Create (or update) ``topic`` on masters; returns the broker groups, once the route shows them all.

        Args:
            topic: topic name.
            queue_nums: read and write queues per group (unless given separately).
            cluster: only the masters of this cluster.
            broker_name: only this group's master.
            read_queue_nums: read queues per group.
            write_queue_nums: write queues per group.
            perm: permission bits.
            timeout_s: bound on waiting for the route to show the topic on every target group.

        Raises:
            RequestTimeoutError: the route did not show the topic within ``timeout_s``.
        """
        validate_topic(topic)
        if not isinstance(queue_nums, int) or not 1 <= queue_nums <= 1024:
            raise InvalidParameterError(f"queue_nums must be in [1, 1024], got {queue_nums!r}")
        cfg = TopicConfig(topic, read_queue_nums or queue_nums, write_queue_nums or queue_nums, perm)
        body = rq.dumps(cfg.to_json())
        masters = self._target_masters(cluster, broker_name)
        for name, addr in masters.items():
            self._broker_call(addr, f"create topic {topic} on {name}",
                              lambda a: rq.json_of(self.client.http.post(f"http://{a}/topic", content=body), a))
        self._wait_route(topic, set(masters), cfg, timeout_s)
        return sorted(masters)

    def _wait_route(self, topic: str, names: set[str], cfg: TopicConfig, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        delay = 0.01
        while True:
            self.client.update_topic_route_from_nameserver(topic)
            route = self.client.routes.route(topic)
            if route is not None:
                seen = {qd.broker_name for qd in route.queue_datas
                        if qd.write_queue_nums == cfg.write_queue_nums and qd.read_queue_nums == cfg.read_queue_nums}
                if names <= seen:
                    return
            if time.monotonic() >= deadline:
                raise RequestTimeoutError(
                    f"topic {topic} not visible in the nameserver route on {sorted(names)} within timeout_s={timeout_s}"
                )
            time.sleep(delay)  # polling the nameserver with a deadline; the route has no push channel
            delay = min(delay * 2, 0.2)

    def update_subscription_group(self, group: str, *, broker_id: int = MASTER_ID,
                                  which_broker_when_consume_slowly: int = 1, retry_max_times: int = 16,
                                  retry_queue_nums: int = 1, consume_enable: bool = True,
                                  consume_broadcast_enable: bool = True, cluster: str | None = None) -> list[str]:
        """Create or update a subscription group on every master (of ``cluster``); returns the groups updated."""
        validate_group(group)
        body = rq.dumps({
            "groupName": group, "brokerId": broker_id, "whichBrokerWhenConsumeSlowly": which_broker_when_consume_slowly,
            "retryMaxTimes": retry_max_times, "retryQueueNums": retry_queue_nums, "consumeEnable": consume_enable,
            "consumeBroadcastEnable": consume_broadcast_enable,
        })
        masters = self._target_masters(cluster, None)
        for name, addr in masters.items():
            self._broker_call(addr, f"update group {group} on {name}",
                              lambda a: rq.json_of(self.client.http.post(f"http://{a}/subscription-group",
                                                                         content=body), a))
        return sorted(masters)

    # --- status ---

    def _broker_call(self, addr: str, what: str, call: Callable[[str], T]) -> T:
        try:
            return call(addr)
        except httpx.HTTPError as e:
            raise rq.map_transport_error(e, addr, what) from None

    def _members(self, broker_name: str) -> dict[int, str]:
        bd = self.cluster_info().broker_addr_table.get(broker_name)
        if bd is None or not bd.broker_addrs:
            raise BrokerNotFoundError(f"The broker[{broker_name}] not exist")
        return dict(bd.broker_addrs)

    def _each_member(self, broker_name: str, what: str, method: str, path: str, *,
                     propagate: tuple[type[ClientError], ...] = ()) -> dict[int, dict[str, Any]]:
        """The JSON answer of every member of ``broker_name`` to ``method path``, by broker id; unreachable
        members show ``{"error", "addr"}``. Errors of the ``propagate`` classes are raised instead: they say the
        request itself is wrong for the group, which asking the other members would only repeat."""
        out: dict[int, dict[str, Any]] = {}
        for bid, addr in sorted(self._members(broker_name).items()):
            try:
                out[bid] = self._broker_call(
                    addr, f"{what} of {broker_name}[{bid}]",
                    lambda a: rq.json_of(self.client.http.request(method, f"http://{a}{path}"), a))
            except propagate:
                raise
            except ClientError as e:
                out[bid] = {"error": str(e), "addr": addr}
        return out

    def ha_status(self, broker_name: str) -> dict[int, dict[str, Any]]:
        """``GET /ha`` of each member of ``broker_name`` by broker id; unreachable members show ``{"error"}``."""
        return self._each_member(broker_name, "ha status", "GET", "/ha")

    def clean_expired_files(self, broker_name: str) -> dict[int, dict[str, Any]]:
        """Run a retention pass now on every member of ``broker_name`` (RocketMQ's ``deleteExpiredCommitLog``):
        each deletes the commit-log files that have expired (``fileReservedTime``), whatever the hour of
        ``deleteWhen``, and the consume-queue and index files that only pointed into them.

        Returns:
            broker id -> ``{"deletedFiles", "bytesReclaimed", "minOffset", "reason", "forced", "diskUsage",
            "lostMessages"}`` (``minOffset`` -1 when nothing was deleted); unreachable members show ``{"error"}``.

        Raises:
            BrokerNotFoundError: no broker group of that name is registered.
        """
        return self._each_member(broker_name, "clean expired files", "POST", "/commitlog/clean")

    # --- DLedger ---

    def dledger_status(self, broker_name: str) -> dict[int, dict[str, Any]]:
        """``GET /dledger`` of every member of the DLedger group ``broker_name``, by the broker id each registered
        with: 0 for the leader serving as master, ``N + 1`` for follower ``nN`` (docs/BEHAVIOUR.md 9.8).

        Each answer holds ``group``, ``selfId``, ``peers`` (id -> peer address, every member of the group),
        ``role`` (LEADER / FOLLOWER / CANDIDATE), ``term``, ``leaderId``, ``leaderAddr`` (the leader's broker
        address, from its heartbeats; None during an election), ``ledgerBeginIndex``,
        ``ledgerEndIndex``, ``committedIndex``, ``elections``, the broker's ``brokerName``, ``brokerId``,
        ``brokerRole`` and ``addr``, and on the leader ``peerProgress`` (peer id -> ``{"ackedIndex", "lag"}``,
        lag in entries behind the leader's end). A member in the route that does not answer shows
        ``{"error", "addr"}``.

        A member that is down has left the nameserver's route, so it is simply missing here. To see it, compare
        the ``peers`` of any answer with the ``selfId`` of the answers (``splitmq dledger status`` lists such
        peers as ``down``); the leader's ``peerProgress`` also keeps the down peer, its lag growing with
        every send.

        Raises:
            BrokerNotFoundError: no broker group of that name is registered.
            InvalidParameterError: the group is not in DLedger mode (``enableDLegerCommitLog=false``).
        """
        return self._each_member(broker_name, "dledger status", "GET", "/dledger",
                                 propagate=(InvalidParameterError,))

    def transfer_leadership(self, broker_name: str, peer_id: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
        """Hand the leadership of the DLedger group ``broker_name`` to its member ``peer_id`` (``"n1"``); returns
        the new leader's ``GET /dledger`` status once the nameserver routes the group's master (id 0) to it,
        so a send made after this call goes to the new leader.

        The request goes to the group's master in the route, the current leader. It refuses sends meanwhile
        (producers retry them), waits until the peer holds every entry, then asks it to campaign at once: on
        loopback the writes pause for well under a second. This is what ``preferredLeaderId`` does by itself
        when the preferred peer is healthy and caught up. Asking the current leader is a no-op.

        Args:
            broker_name: the broker group (its ``brokerName``; the DLedger group of the same members).
            peer_id: the member to lead, as in ``dLegerPeers`` (``n0``, ``n1``, ...).
            timeout_s: bound on the transfer and on the wait for the route.

        Raises:
            BrokerNotFoundError: no broker group of that name is registered, or it has no master in the route
                (an election under way: ask again when ``dledger_status`` shows a leader).
            InvalidParameterError: ``peer_id`` is not a member of the group, or the group is not in DLedger mode.
            ServiceNotAvailableError: ``peer_id`` is not registered (down), or the leader could not hand over
                (the peer did not catch up or refused, or the leadership moved meanwhile); the group keeps a
                leader either way.
            RequestTimeoutError: the route did not show ``peer_id`` as the master within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        status = self.dledger_status(broker_name)
        answered = {st["selfId"]: st for st in status.values() if "error" not in st and "selfId" in st}
        if not answered:
            errors = "; ".join(f"[{bid}] {st.get('error')}" for bid, st in sorted(status.items()))
            raise BrokerNotFoundError(f"no member of broker group {broker_name} answered: {errors}")
        peers = sorted(next(iter(answered.values())).get("peers") or {})
        if peer_id not in peers:
            raise InvalidParameterError(f"{peer_id!r} is not a member of DLedger group {broker_name} "
                                        f"(peers: {', '.join(peers)})")
        master = status.get(MASTER_ID)
        if master is None or "error" in master:
            raise BrokerNotFoundError(f"broker group {broker_name} has no master (leader) in the route; an election "
                                      "may be under way: ask again when dledger status shows a leader")
        if master.get("selfId") == peer_id:
            return master
        target = answered.get(peer_id)
        if target is None:
            raise ServiceNotAvailableError(f"{peer_id} of broker group {broker_name} is not registered with the "
                                           "nameserver (down?); a transfer needs it running and caught up")
        leader_addr, target_addr = str(master["addr"]), str(target["addr"])
        # the leader's own bound ends half a second before this call's, so its refusal (not a timeout) arrives
        left_ms = int((deadline - time.monotonic() - 0.5) * 1000)
        url = (f"http://{leader_addr}/dledger/transfer?peer={rq.q(peer_id)}"
               f"&timeoutMs={min(MAX_TRANSFER_TIMEOUT_MS, max(100, left_ms))}")
        self._broker_call(
            leader_addr, f"leadership transfer of {broker_name} to {peer_id}",
            lambda a: rq.json_of(self.client.http.post(
                url, timeout=self.client.config.timeout(max(0.1, deadline - time.monotonic()))), a))
        self._wait_master(broker_name, target_addr, f"{peer_id} ({target_addr})", deadline, timeout_s)
        return self._broker_call(target_addr, f"dledger status of {broker_name} {peer_id}",
                                 lambda a: rq.json_of(self.client.http.get(f"http://{a}/dledger"), a))

    def _wait_master(self, broker_name: str, addr: str, who: str, deadline: float, timeout_s: float) -> None:
        """Until the nameserver's route gives ``addr`` as the master of ``broker_name``."""
        delay = 0.01
        while True:
            bd = self.cluster_info().broker_addr_table.get(broker_name)
            if bd is not None and bd.broker_addrs.get(MASTER_ID) == addr:
                return
            if time.monotonic() >= deadline:
                now = dict(bd.broker_addrs) if bd is not None else {}
                raise RequestTimeoutError(f"the route of {broker_name} does not show {who} as its master within "
                                          f"timeout_s={timeout_s} (members now: {now})")
            time.sleep(delay)  # polling the nameserver with a deadline; the route has no push channel
            delay = min(delay * 2, 0.2)

    def broker_runtime(self, addr: str) -> dict[str, Any]:
        """``GET /runtime`` of one broker."""
        return self._broker_call(addr, f"runtime of {addr}",
                                 lambda a: rq.json_of(self.client.http.get(f"http://{a}/runtime"), a))

    def _queue_offset(self, members: Mapping[int, str], url_of: Callable[[str], str], default: int | None) -> int:
        last: ClientError | None = None
        for _, addr in sorted(members.items()):
            try:
                return rq.parse_offset(self.client.http.get(url_of(addr)), addr)
            except QueryNotFoundError:
                if default is not None:
                    return default
                raise
            except httpx.HTTPError as e:
                last = rq.map_transport_error(e, addr, f"offset query at {addr}")
        assert last is not None
        raise last

    def min_offset(self, mq: MessageQueue) -> int:
        """Smallest logical offset still stored in ``mq`` (it moves up when retention deletes old files), asked of
        the master, else a slave."""
        return self._queue_offset(self._members(mq.broker_name), partial(rq.offset_url, kind="min", mq=mq), None)

    def max_offset(self, mq: MessageQueue) -> int:
        """One past the last logical offset of ``mq``, asked of the master, else a slave."""
        return self._queue_offset(self._members(mq.broker_name), partial(rq.offset_url, kind="max", mq=mq), None)

    def consumer_progress(self, group: str, topic: str) -> list[QueueProgress]:
        """Per readable queue of ``topic``: broker max offset, the group's offset, and the lag."""
        validate_group(group)
        route = self.topic_route(topic)
        out = []
        last_pulls: dict[str, dict[int, int]] = {}
        for qd in route.queue_datas:
            bd = route.broker_data(qd.broker_name)
            if bd is None or not Perm.readable(qd.perm):
                continue
            last_pulls[qd.broker_name] = self._last_pull_members(group, topic, bd.broker_addrs)
            for qid in range(qd.read_queue_nums):
                mq = MessageQueue(topic, qd.broker_name, qid)
                broker_off = self._queue_offset(bd.broker_addrs, partial(rq.offset_url, kind="max", mq=mq), None)
                consumer_off = self._queue_offset(
                    bd.broker_addrs, partial(rq.offset_url, kind="consumer", mq=mq, group=group), -1)
                out.append(QueueProgress(mq, broker_off, consumer_off, broker_off - max(consumer_off, 0),
                                         last_pulls.get(qd.broker_name, {}).get(qid)))
        return out

    def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``mq`` stored at or after ``timestamp_ms`` (the max offset when none is), asked of
        the master, else a slave."""
        return self._queue_offset(self._members(mq.broker_name),
                                  partial(rq.offset_url, kind="search", mq=mq, timestamp_ms=int(timestamp_ms)), None)

    def consumer_ids(self, group: str, topic: str) -> list[str]:
        """The client ids online in ``group`` (heartbeating), as the masters of ``topic``'s broker groups list
        them; masters that do not answer are skipped."""
        validate_group(group)
        route = self.topic_route(topic)
        ids: set[str] = set()
        for bd in route.broker_datas:
            addr = bd.broker_addrs.get(MASTER_ID)
            if addr is None:
                continue
            try:
                obj = rq.json_of(self.client.http.get(f"http://{addr}/consumer/ids?group={rq.q(group)}"), addr)
            except (httpx.HTTPError, ClientError) as e:
                log.debug("consumer ids of %s at %s: %s", group, addr, e)
                continue
            ids.update(str(i) for i in obj.get("clientIds") or [])
        return sorted(ids)

    def reset_consumer_offset(self, group: str, topic: str, *, to: str = "earliest",
                              timestamp_ms: int | None = None) -> dict[MessageQueue, int]:
        """Set ``group``'s committed offset of every readable queue of ``topic`` (``resetOffsetByTimestamp`` of
        an offline group): to each queue's min offset (``to="earliest"``), its max offset (``"latest"``: skip
        everything stored), or the first message stored at or after ``timestamp_ms`` (``"timestamp"``).

        The group must have no consumer online: a running consumer keeps its own positions and would write them
        back at its next commit (RocketMQ's brokers tell online clients to reset; SplitMQ's cannot), so, as
        Kafka's ``--reset-offsets``, this refuses while any is.

        Returns:
            The offsets stored, by queue.

        Raises:
            InvalidParameterError: ``to`` is not one of the three, ``timestamp_ms`` is missing for
                ``"timestamp"``, or the group has consumers online (named).
            RouteNotFoundError: no nameserver knows the topic.
        """
        validate_group(group)
        if to not in ("earliest", "latest", "timestamp"):
            raise InvalidParameterError(f"to must be earliest, latest or timestamp, got {to!r}")
        if to == "timestamp" and (isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int)
                                  or timestamp_ms < 0):
            raise InvalidParameterError(f"timestamp_ms must be ms since the epoch (>= 0), got {timestamp_ms!r}")
        online = self.consumer_ids(group, topic)
        if online:
            raise InvalidParameterError(
                f"consumer group {group} has {len(online)} consumer(s) online ({', '.join(online)}): they would "
                "overwrite the reset at their next commit; stop them, then reset")
        route = self.topic_route(topic)
        out: dict[MessageQueue, int] = {}
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            bd = route.broker_data(qd.broker_name)
            if bd is None or not Perm.readable(qd.perm):
                continue
            master = bd.broker_addrs.get(MASTER_ID)
            if master is None:
                raise BrokerNotFoundError(f"The broker[{qd.broker_name}] has no master: offsets are committed there")
            offsets = []
            for qid in range(qd.read_queue_nums):
                mq = MessageQueue(topic, qd.broker_name, qid)
                kind = {"earliest": "min", "latest": "max", "timestamp": "search"}[to]
                off = self._queue_offset(bd.broker_addrs, partial(rq.offset_url, kind=kind, mq=mq,
                                                                  timestamp_ms=timestamp_ms if kind == "search"
                                                                  else None), None)
                offsets.append((mq, off))
            body = rq.commit_offsets_body(group, offsets)

            def commit(a: str, b: bytes = body) -> dict[str, Any]:
                return rq.json_of(self.client.http.post(f"http://{a}/offset/consumer", content=b), a)
            self._broker_call(master, f"reset offsets of {group} on {qd.broker_name}", commit)
            out.update(offsets)
        return out

    def _last_pull_members(self, group: str, topic: str, members: Mapping[int, str]) -> dict[int, int]:
        """``queue id -> member id`` that served the newest pull of ``group`` (members that cannot be asked are
        skipped: a dead master simply has no say)."""
        newest: dict[int, tuple[int, int]] = {}
        for bid, addr in sorted(members.items()):
            try:
                obj = rq.json_of(self.client.http.get(
                    f"http://{addr}/consumer/pulls?group={rq.q(group)}&topic={rq.q(topic)}"), addr)
                for qid, ms in dict(obj.get("lastPullTimestamp", {})).items():
                    if int(ms) > newest.get(int(qid), (-1, -1))[0]:
                        newest[int(qid)] = (int(ms), bid)
            except (httpx.HTTPError, ClientError, ValueError, TypeError, AttributeError) as e:
                log.debug("last pulls of %s at %s: %s", group, addr, e)
        return {qid: bid for qid, (_, bid) in newest.items()}

    def topic_offsets(self, topic: str) -> list[tuple[MessageQueue, int, int]]:
        """``(queue, min offset, max offset)`` of every readable queue of ``topic``, from one route lookup (each
        queue asked of the master, else a slave): what a dashboard polls every second.

        Raises:
            RouteNotFoundError: no nameserver knows the topic.
        """
        route = self.topic_route(topic)
        out = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            bd = route.broker_data(qd.broker_name)
            if bd is None or not Perm.readable(qd.perm):
                continue
            for qid in range(qd.read_queue_nums):
                mq = MessageQueue(topic, qd.broker_name, qid)
                lo = self._queue_offset(bd.broker_addrs, partial(rq.offset_url, kind="min", mq=mq), None)
                hi = self._queue_offset(bd.broker_addrs, partial(rq.offset_url, kind="max", mq=mq), None)
                out.append((mq, lo, hi))
        return out

    def consumer_groups(self) -> dict[str, list[str]]:
        """``{group: [topics]}``: the groups that committed offsets on any broker group, with their topics (from
        each group's ``GET /offsets``, asked of the master, else a slave, since slaves hold the master's table).

        Raises:
            BrokerNotFoundError: no broker is registered with the nameserver.
        """
        info = self.cluster_info()
        if not info.broker_addr_table:
            raise BrokerNotFoundError("no broker is registered with the nameserver")
        out: dict[str, set[str]] = {}
        for name, bd in sorted(info.broker_addr_table.items()):
            for _, addr in sorted(bd.broker_addrs.items()):
                try:
                    table = rq.json_of(self.client.http.get(f"http://{addr}/offsets"), addr).get("offsetTable") or {}
                except (httpx.HTTPError, ClientError) as e:
                    log.debug("offset table of %s at %s: %s", name, addr, e)
                    continue
                for key in dict(table):
                    topic, sep, group = str(key).partition("@")
                    if sep and group:
                        out.setdefault(group, set()).add(topic)
                break
        return {g: sorted(ts) for g, ts in sorted(out.items())}

    def broker_metrics(self, addr: str) -> str:
        """``GET /metrics`` of one broker: its Prometheus text exposition (counters, gauges, histograms)."""
        def call(a: str) -> str:
            resp = self.client.http.get(f"http://{a}/metrics")
            rq.raise_for_status(resp, a)
            return resp.text
        return self._broker_call(addr, f"metrics of {addr}", call)

    def queue_store_time(self, mq: MessageQueue, offset: int) -> int | None:
        """When the message at ``offset`` of ``mq`` was stored (ms), asked of the master, else a slave; None when
        no member has it."""
        route = self.topic_route(mq.topic)
        bd = route.broker_data(mq.broker_name)
        if bd is None:
            raise BrokerNotFoundError(f"The broker[{mq.broker_name}] not exist")
        for _, addr in sorted(bd.broker_addrs.items()):
            url = (f"http://{addr}/offset/storetime?topic={rq.q(mq.topic)}&queueId={mq.queue_id}"
                   f"&offset={int(offset)}")
            try:
                return int(rq.json_of(self.client.http.get(url), addr)["timestamp"])
            except QueryNotFoundError:
                return None
            except httpx.HTTPError:
                continue
        return None

    # --- messages ---

    def _records(self, addr: str, url: str, broker_name: str) -> list[MessageExt]:
        resp = self.client.http.get(url)
        rq.raise_for_status(resp, addr)
        return codec.decode_records(resp.content, broker_name=broker_name)

    def query_message(self, msg_id: str, *, topic: str | None = None, broker_id: int | None = None) -> MessageExt:
        """Find a message by offset msgId (asks the store host's group), or by unique key (needs ``topic``).

        Each group is asked master first, then its slaves (a slave holds the master's commit log at the same
        offsets), so a dead master's messages are still found.

        Args:
            msg_id: the offset msgId (``SendResult.offset_msg_id``) or the unique key (``SendResult.msg_id``).
            topic: where to search ``msg_id`` as a unique key when it is not a known offset msgId.
            broker_id: ask only the member with this id of each group (0 = masters, 1 = first slaves).

        Raises:
            QueryNotFoundError: no broker has it.
            InvalidParameterError: ``msg_id`` is not an offset msgId of a known broker and no ``topic`` is given,
                or ``broker_id`` is negative.
        """
        members = _member_filter(broker_id)
        info = self.cluster_info()
        try:
            store, phy = codec.decode_offset_msg_id(msg_id)
        except ClientError:
            store, phy = "", -1
        if phy >= 0:
            groups = sorted(info.broker_addr_table.items())
            # The store host's own group first; a dead master is gone from the table, so then every group
            # (slaves hold the master's offsets), accepting only a record whose msgId matches.
            groups.sort(key=lambda item: store not in item[1].broker_addrs.values())
            for name, bd in groups:
                for _, addr in members(bd.broker_addrs):
                    try:
                        msgs = self._records(addr, f"http://{addr}/message?offsetMsgId={rq.q(msg_id)}", name)
                    except (httpx.HTTPError, QueryNotFoundError, InvalidParameterError):
                        continue
                    if msgs and msgs[0].offset_msg_id == msg_id.upper():
                        return msgs[0]
        if topic is None:
            raise InvalidParameterError(
                f"msgId {msg_id} is not the offset msgId of a known broker; pass topic= to search it as a unique key"
            )
        found = self._query_all(topic, lambda a: f"http://{a}/message/uniq?topic={rq.q(topic)}&msgId={rq.q(msg_id)}",
                                members)
        if not found:
            where = "" if broker_id is None else f" on the members with broker id {broker_id}"
            raise QueryNotFoundError(f"no message with id {msg_id} in topic {topic}{where}")
        return found[0]

    def query_messages_by_key(self, topic: str, key: str, *, max_num: int = 32,
                              broker_id: int | None = None) -> list[MessageExt]:
        """Messages of ``topic`` indexed under ``key`` on every broker group (master, else a slave).

        Args:
            topic: the topic.
            key: a key the messages were sent with (``Message.keys``).
            max_num: at most this many per group.
            broker_id: ask only the member with this id of each group (0 = masters, 1 = first slaves).

        Raises:
            InvalidParameterError: ``broker_id`` is negative.
        """
        validate_topic(topic)
        return self._query_all(
            topic, lambda a: f"http://{a}/message/key?topic={rq.q(topic)}&key={rq.q(key)}&maxNum={max_num}",
            _member_filter(broker_id),
        )

    def _query_all(self, topic: str, url_of: Callable[[str], str],
                   members: Callable[[Mapping[int, str]], list[tuple[int, str]]]) -> list[MessageExt]:
        route = self.topic_route(topic)
        out: list[MessageExt] = []
        for bd in route.broker_datas:
            for _, addr in members(bd.broker_addrs):
                try:
                    out.extend(self._records(addr, url_of(addr), bd.broker_name))
                    break
                except QueryNotFoundError:
                    break
                except httpx.HTTPError as e:
                    log.info("query at %s failed (%s); trying the next member", addr, e)
        return out


def _member_filter(broker_id: int | None) -> Callable[[Mapping[int, str]], list[tuple[int, str]]]:
    """Members of a group to ask, in order: all (master first) or only ``broker_id``."""
    if broker_id is not None and (isinstance(broker_id, bool) or not isinstance(broker_id, int) or broker_id < 0):
        raise InvalidParameterError(f"broker_id must be an int >= 0 (0 = master), got {broker_id!r}")

    def members(addrs: Mapping[int, str]) -> list[tuple[int, str]]:
        return [(bid, a) for bid, a in sorted(addrs.items()) if broker_id is None or bid == broker_id]

    return members
