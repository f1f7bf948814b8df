"""mqadmin equivalents: cluster list, topics, subscription groups, HA status, consumer progress, broker status.

Each ``cmd_*`` takes the parsed arguments and an :class:`~client.cli._output.Output`, prints its result and
returns the exit code; client errors propagate to :func:`client.cli.main`, which prints them as one line.
"""

from __future__ import annotations

import argparse
from typing import Any

import httpx

from client import _requests as rq
from client._admin import Admin
from client._consumer import PullConsumer
from client.cli._common import client_config, namesrv_of, open_admin
from client.cli._output import NA, Output, fmt_time_ms
from common.codes import MASTER_ID
from common.errors import BrokerNotFoundError, ClientError, RouteNotFoundError
from common.message import MessageQueue

__all__ = [
    "cmd_broker_status",
    "cmd_cluster_list",
    "cmd_consumer_progress",
    "cmd_group_update",
    "cmd_ha_status",
    "cmd_topic_list",
    "cmd_topic_route",
    "cmd_topic_status",
    "cmd_topic_update",
]

#: Group the status commands pull with to read a queue's last store time (RocketMQ's tools use the same name).
TOOLS_GROUP = "TOOLS_CONSUMER"


def _role_of(broker_id: int) -> str:
    return "master" if broker_id == MASTER_ID else "slave"


# --- cluster -------------------------------------------------------------------------------------------------


def cmd_cluster_list(args: argparse.Namespace, out: Output) -> int:
    """Brokers per cluster from the nameserver, with each broker's role and offsets from ``GET /runtime``."""
    with open_admin(args) as adm:
        info = adm.cluster_info()
        rows: list[dict[str, Any]] = []
        for name, bd in sorted(info.broker_addr_table.items()):
            for bid, addr in sorted(bd.broker_addrs.items()):
                live = info.broker_live_table.get(addr) or {}
                row: dict[str, Any] = {
                    "cluster": bd.cluster, "brokerName": name, "brokerId": bid, "addr": addr,
                    "haAddr": live.get("haServerAddr"), "lastUpdateTimestamp": live.get("lastUpdateTimestamp"),
                }
                try:
                    rt = adm.broker_runtime(addr)
                    row.update(role=rt.get("role"), commitLogMaxOffset=rt.get("commitLogMaxOffset"),
                               putTps=rt.get("putTps"))
                except ClientError as e:
                    row.update(role=f"unreachable({_role_of(bid)})", commitLogMaxOffset=None, putTps=None,
                               error=str(e))
                rows.append(row)
    if out.json_mode:
        out.json({"brokers": rows, "clusters": {c: list(n) for c, n in info.cluster_addr_table.items()}})
        return 0
    out.table(
        ("CLUSTER", "BROKER", "ID", "ROLE", "ADDR", "HA_ADDR", "MAX_OFFSET", "PUT_TPS", "LAST_HEARTBEAT"),
        [(r["cluster"], r["brokerName"], r["brokerId"], r["role"], r["addr"], r["haAddr"], r["commitLogMaxOffset"],
          r["putTps"], fmt_time_ms(r["lastUpdateTimestamp"])) for r in rows],
    )
    return 0


# --- topics --------------------------------------------------------------------------------------------------


def _topic_configs(adm: Admin, topic: str) -> dict[str, tuple[int, int, int]]:
    """``{broker group: (read queues, write queues, perm)}`` of ``topic`` in the nameserver's route ({} when none)."""
    try:
        route = adm.topic_route(topic)
    except RouteNotFoundError:
        return {}
    return {qd.broker_name: (qd.read_queue_nums, qd.write_queue_nums, qd.perm) for qd in route.queue_datas}


def _topic_verb(before: dict[str, tuple[int, int, int]], brokers: list[str], want: tuple[int, int, int]) -> str:
    """What ``topic create``/``update`` did, from the route before it: created, updated, or exists, unchanged."""
    had = [b for b in brokers if b in before]
    if not had:
        return "created"
    if len(had) == len(brokers) and all(before[b] == want for b in brokers):
        return "exists, unchanged"
    return "updated" if len(had) == len(brokers) else "created or updated"


def cmd_topic_update(args: argparse.Namespace, out: Output) -> int:
    """``topic create`` / ``topic update``: the topic config on masters, then wait for the route to show it; says
    whether the topic was created, updated, or already existed as asked."""
    with open_admin(args) as adm:
        before = _topic_configs(adm, args.topic)
        brokers = adm.create_topic(
            args.topic, queue_nums=max(args.read_queues, args.write_queues), cluster=args.cluster,
            broker_name=args.broker_name, read_queue_nums=args.read_queues, write_queue_nums=args.write_queues,
            perm=args.perm, timeout_s=args.timeout,
        )
    verb = _topic_verb(before, brokers, (args.read_queues, args.write_queues, args.perm))
    if out.json_mode:
        out.json({"topic": args.topic, "brokers": brokers, "readQueueNums": args.read_queues,
                  "writeQueueNums": args.write_queues, "perm": args.perm, "result": verb})
    else:
        out.line(f"topic {args.topic} {verb} on {', '.join(brokers)} "
                 f"(read queues {args.read_queues}, write queues {args.write_queues}, perm {args.perm})")
    return 0


def cmd_topic_route(args: argparse.Namespace, out: Output) -> int:
    """The nameserver's route of a topic: queue data per broker group and the groups' members."""
    with open_admin(args) as adm:
        route = adm.topic_route(args.topic)
    if out.json_mode:
        out.json(route.to_json())
        return 0
    out.table(("BROKER", "READ_QUEUES", "WRITE_QUEUES", "PERM"),
              [(qd.broker_name, qd.read_queue_nums, qd.write_queue_nums, qd.perm) for qd in route.queue_datas],
              title=f"topic {args.topic} queues:")
    out.line()
    out.table(("BROKER", "CLUSTER", "ID", "ROLE", "ADDR"),
              [(bd.broker_name, bd.cluster, bid, _role_of(bid), addr)
               for bd in route.broker_datas for bid, addr in sorted(bd.broker_addrs.items())],
              title="brokers:")
    return 0


def cmd_topic_status(args: argparse.Namespace, out: Output) -> int:
    """Per queue: min and max offset (master, else a slave) and the store time of its last message."""
    with open_admin(args) as adm:
        route = adm.topic_route(args.topic)
        consumer = PullConsumer(TOOLS_GROUP, namesrv_of(args), client_config=client_config(args),
                                pull_timeout_s=args.timeout)
        rows: list[dict[str, Any]] = []
        try:
            for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
                for qid in range(max(qd.read_queue_nums, qd.write_queue_nums)):
                    mq = MessageQueue(args.topic, qd.broker_name, qid)
                    lo, hi = consumer.min_offset(mq), consumer.max_offset(mq)
                    last = adm.queue_store_time(mq, hi - 1) if hi > 0 else None
                    rows.append({"brokerName": qd.broker_name, "queueId": qid, "minOffset": lo, "maxOffset": hi,
                                 "lastUpdateTimestamp": last})
        finally:
            consumer.close()
    if out.json_mode:
        out.json({"topic": args.topic, "queues": rows})
        return 0
    out.table(("BROKER", "QUEUE", "MIN_OFFSET", "MAX_OFFSET", "LAST_UPDATE"),
              [(r["brokerName"], r["queueId"], r["minOffset"], r["maxOffset"], fmt_time_ms(r["lastUpdateTimestamp"]))
               for r in rows])
    return 0


def cmd_topic_list(args: argparse.Namespace, out: Output) -> int:
    """The topics the nameserver knows, one per line."""
    with open_admin(args) as adm:
        topics = adm.topic_list()
    if out.json_mode:
        out.json({"topics": topics})
    else:
        for t in topics:
            out.line(t)
    return 0


# --- groups --------------------------------------------------------------------------------------------------


def cmd_group_update(args: argparse.Namespace, out: Output) -> int:
    """``group create`` / ``group update``: create or update a subscription group on every master (of
    ``--cluster``), as mqadmin updateSubGroup; a cluster with ``autoCreateSubscriptionGroup=false`` needs it
    before a consumer of the group pulls."""
    with open_admin(args) as adm:
        brokers = adm.update_subscription_group(
            args.group, broker_id=args.broker_id, which_broker_when_consume_slowly=args.slow_broker_id,
            retry_max_times=args.retry_max_times, cluster=args.cluster,
        )
    cfg = {"groupName": args.group, "brokerId": args.broker_id, "whichBrokerWhenConsumeSlowly": args.slow_broker_id,
           "retryMaxTimes": args.retry_max_times}
    if out.json_mode:
        out.json({"brokers": brokers, "config": cfg})
    else:
        out.line(f"group {args.group} created or updated on {', '.join(brokers)} (brokerId {args.broker_id}, "
                 f"whichBrokerWhenConsumeSlowly {args.slow_broker_id}, retryMaxTimes {args.retry_max_times})")
    return 0


# --- HA ------------------------------------------------------------------------------------------------------


def _print_ha(name: str, status: dict[int, dict[str, Any]], out: Output) -> None:
    master = status.get(MASTER_ID)
    if master is not None and "error" not in master:
        out.kv([("master", f"{name}[0] {master.get('role')} ha {master.get('haAddr')}"),
                ("masterMaxOffset", master.get("masterMaxOffset")),
                ("push2SlaveMaxOffset", master.get("push2SlaveMaxOffset")),
                ("connections", master.get("connectionCount"))])
        out.line()
        out.table(("SLAVE_ADDR", "ACK_OFFSET", "DIFF_BYTES", "IN_SYNC", "SPEED_B/S", "TRANSFERRED_BYTES"),
                  [(s.get("addr"), s.get("ackOffset"), s.get("diff"), s.get("inSync"),
                    s.get("transferSpeedBytesPerS"), s.get("transferredBytes")) for s in master.get("slaves") or ()],
                  title="slave connections (master's view):")
        out.line()
    rows = []
    for bid, st in sorted(status.items()):
        if bid == MASTER_ID:
            continue
        client = st.get("client") or {}
        rows.append((bid, st.get("role", "unreachable") if "error" not in st else "unreachable",
                     client.get("masterAddress"), client.get("connected"), client.get("maxOffset"),
                     fmt_time_ms(client.get("lastReadTimestamp")), client.get("lastError")))
    out.table(("ID", "ROLE", "MASTER_HA_ADDR", "CONNECTED", "MAX_OFFSET", "LAST_READ", "LAST_ERROR"), rows,
              title="slaves (their own view):")


def cmd_ha_status(args: argparse.Namespace, out: Output) -> int:
    """The master's haStatus (one row per slave connection) and each slave's HA client state."""
    with open_admin(args) as adm:
        status = adm.ha_status(args.broker_name)
    if out.json_mode:
        out.json({"brokerName": args.broker_name, "members": {str(k): v for k, v in status.items()}})
    else:
        _print_ha(args.broker_name, status, out)
    for bid, st in sorted(status.items()):
        if bid != MASTER_ID and "error" in st:
            out.warn(f"slave {args.broker_name}[{bid}] did not answer: {st['error']}")
    master = status.get(MASTER_ID)
    if master is None:
        out.error(f"broker group {args.broker_name} has no master registered with the nameserver")
        return 1
    if "error" in master:
        out.error(f"master of {args.broker_name} did not answer: {master['error']}")
        return 1
    return 0


# --- consumer progress ---------------------------------------------------------------------------------------


def _group_topics(adm: Admin, group: str) -> list[str]:
    """Topics ``group`` committed offsets for on any master (from each master's ``GET /offsets``)."""
    topics: set[str] = set()
    suffix = "@" + group
    for _, addr in sorted(adm.cluster_info().master_addrs().items()):
        try:
            resp = adm.client.http.get(f"http://{addr}/offsets")
        except httpx.HTTPError as e:
            raise rq.map_transport_error(e, addr, f"offset table of {addr}") from None
        table = rq.json_of(resp, addr).get("offsetTable") or {}
        topics.update(key[: -len(suffix)] for key in table if key.endswith(suffix))
    return sorted(topics)


def _node(broker_id: int | None) -> str:
    if broker_id is None:
        return NA
    return f"{broker_id}:master" if broker_id == 0 else f"{broker_id}:slave"


def cmd_consumer_progress(args: argparse.Namespace, out: Output) -> int:
    """Per queue: broker max offset, the group's committed offset, lag, and the member that served the newest pull."""
    with open_admin(args) as adm:
        topics = [args.topic] if args.topic else _group_topics(adm, args.group)
        if not topics:
            raise ClientError(f"group {args.group} has committed no offsets on any master "
                                      f"(pass -t TOPIC to see a topic's queues)")
        progress = [qp for t in topics for qp in adm.consumer_progress(args.group, t)]
    rows: list[dict[str, Any]] = [{"topic": qp.message_queue.topic, "brokerName": qp.message_queue.broker_name,
             "queueId": qp.message_queue.queue_id, "brokerOffset": qp.broker_offset,
             "consumerOffset": qp.consumer_offset, "lag": qp.lag, "lastPullBrokerId": qp.last_pull_broker_id} for qp in progress]
    total = sum(qp.lag for qp in progress)
    if out.json_mode:
        out.json({"group": args.group, "queues": rows, "totalLag": total})
        return 0
    out.table(("TOPIC", "BROKER", "QUEUE", "BROKER_OFFSET", "CONSUMER_OFFSET", "LAG", "LAST_PULL_NODE"),
              [(r["topic"], r["brokerName"], r["queueId"], r["brokerOffset"], r["consumerOffset"], r["lag"],
                _node(r["lastPullBrokerId"])) for r in rows])
    out.line(f"total lag: {total}")
    return 0


# --- broker --------------------------------------------------------------------------------------------------


def cmd_broker_status(args: argparse.Namespace, out: Output) -> int:
    """One broker's ``GET /runtime``, chosen by ``--addr`` or by ``-b NAME [-i ID]``."""
    with open_admin(args) as adm:
        addr = args.addr
        if addr is None:
            bd = adm.cluster_info().broker_addr_table.get(args.broker_name)
            if bd is None or args.broker_id not in bd.broker_addrs:
                have = sorted(bd.broker_addrs) if bd is not None else []
                raise BrokerNotFoundError(f"The broker[{args.broker_name}] id {args.broker_id} not exist "
                                          f"(registered ids: {have})")
            addr = bd.broker_addrs[args.broker_id]
        rt = adm.broker_runtime(addr)
    if out.json_mode:
        out.json(rt)
    else:
        out.kv(sorted(_flatten(rt).items()))
    return 0


def _flatten(obj: dict[str, Any], prefix: str = "") -> dict[str, object]:
    """Nested objects as ``key.sub`` lines; used fractions (``...Ratio``) as percents."""
    flat: dict[str, object] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        elif isinstance(value, float) and "Ratio." in name:
            flat[name] = f"{value:.1%}"
        else:
            flat[name] = value
    return flat


def cmd_broker_clean(args: argparse.Namespace, out: Output) -> int:
    """``Admin.clean_expired_files``: a retention pass now on each member of ``-b NAME``."""
    with open_admin(args) as adm:
        reports = adm.clean_expired_files(args.broker_name)
    if out.json_mode:
        out.json({str(bid): r for bid, r in reports.items()})
        return 0 if all("error" not in r for r in reports.values()) else 1
    rows = []
    why = []
    for bid, r in sorted(reports.items()):
        who = f"{args.broker_name}[{bid}] {_role_of(bid)}"
        if "error" in r:
            rows.append([str(bid), _role_of(bid), "-", "-", "-"])
            why.append(f"{who}: did not answer: {r['error']}")
            continue
        rows.append([str(bid), _role_of(bid), str(r["deletedFiles"]), str(r["bytesReclaimed"]),
                     str(r["minOffset"]) if r["deletedFiles"] else "-"])
        lost = ", ".join(f"{g} lost {n}" for g, n in sorted(r["lostMessages"].items()))
        what = (f"deleted {r['deletedFiles']} expired file(s)" if r["deletedFiles"]
                else "nothing had expired (fileReservedTime), nothing deleted")
        why.append(f"{who}: {what}; why: {r['reason']}" + (f"; consumer groups: {lost}" if lost else ""))
    out.table(["BROKER_ID", "ROLE", "DELETED_FILES", "BYTES", "MIN_OFFSET"], rows)
    for line in why:
        out.line(line)
    return 0 if all("error" not in r for r in reports.values()) else 1
