"""``splitmq dledger status`` and ``splitmq dledger transfer``: a DLedger group's members and its leadership.

The nameserver knows a DLedger group as an ordinary broker group (leader id 0, follower ``nN`` id ``N + 1``,
docs/DLEDGER.md), so the status asks every member in the route and then names the peers of ``dLegerPeers`` that
did not answer: a member stopped has left the route (a crashed one stays until the nameserver expires it), and
only the group's peer list still shows it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from client.cli._common import open_admin
from client.cli._output import NA, Output

__all__ = ["cmd_dledger_status", "cmd_dledger_transfer", "status_rows"]

#: ROLE of a peer of the group that is not in the route (stopped, expired, or not registered yet).
DOWN = "down"
#: ROLE of a member in the route that did not answer (crashed: the nameserver keeps it until it expires).
UNREACHABLE = "unreachable"


def status_rows(status: Mapping[int, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per peer of the group, sorted by peer id: the members that answered; the members in the route
    that did not (``unreachable``: crashed, until the nameserver expires them); and the peers of ``dLegerPeers``
    missing from the route (``down``: stopped, or expired).

    A member that did not answer cannot say which peer it is: a follower's id gives it (``nN`` registers
    ``N + 1``), and the one left over is matched with the one peer left over. Lag is the leader's count of
    entries a peer is behind (its ``peerProgress``); None when no leader answered.
    """
    answered = {bid: st for bid, st in status.items() if "error" not in st and "selfId" in st}
    leaders = [st for st in answered.values() if st.get("role") == "LEADER"]
    # The leader with the highest term speaks for the group (an old leader cut off may still think it leads).
    leader = max(leaders, key=lambda st: int(st.get("term", -1)), default=None)
    progress: Mapping[str, Mapping[str, Any]] = (leader or {}).get("peerProgress") or {}
    peers: dict[str, Any] = {}
    for st in answered.values():
        peers.update(st.get("peers") or {})
    rows: dict[str, dict[str, Any]] = {}
    for bid, st in answered.items():
        peer = str(st["selfId"])
        rows[peer] = {"peer": peer, "brokerId": bid, "role": st.get("role"), "term": st.get("term"),
                      "leaderId": st.get("leaderId"), "ledgerEndIndex": st.get("ledgerEndIndex"),
                      "committedIndex": st.get("committedIndex"), "lag": _lag(peer, leader, progress),
                      "addr": st.get("addr")}
    missing = sorted(set(peers) - set(rows))
    silent = {bid: st for bid, st in status.items() if bid not in answered}
    named: dict[int, str] = {bid: f"n{bid - 1}" for bid in silent if f"n{bid - 1}" in missing}
    left_bids, left_peers = set(silent) - set(named), [p for p in missing if p not in named.values()]
    if len(left_bids) == 1 and len(left_peers) == 1:
        named[left_bids.pop()] = left_peers[0]
    for bid, st in silent.items():
        who = named.get(bid)
        rows[who or f"?{bid}"] = {"peer": who, "brokerId": bid, "role": UNREACHABLE, "term": None,
                                  "leaderId": None, "ledgerEndIndex": None, "committedIndex": None,
                                  "lag": _lag(who, leader, progress) if who else None, "addr": st.get("addr"),
                                  "error": st.get("error")}
    for peer in missing:
        if peer not in rows:
            rows[peer] = {"peer": peer, "brokerId": None, "role": DOWN, "term": None, "leaderId": None,
                          "ledgerEndIndex": None, "committedIndex": None, "lag": _lag(peer, leader, progress),
                          "addr": None}
    return [rows[k] for k in sorted(rows)]


def _lag(peer: str, leader: Mapping[str, Any] | None, progress: Mapping[str, Mapping[str, Any]]) -> int | None:
    if leader is None:
        return None
    if peer == leader.get("selfId"):
        return 0
    entry = progress.get(peer)
    return int(entry["lag"]) if entry is not None and "lag" in entry else None


def cmd_dledger_status(args: argparse.Namespace, out: Output) -> int:
    """Every peer of ``-b NAME``: role, term, leader, ledger end and committed index, the leader's lag count.

    Exit code 1 when no member leads (an election under way, or no quorum), so a script can wait on it.
    """
    with open_admin(args) as adm:
        status = adm.dledger_status(args.broker_name)
    rows = status_rows(status)
    leaders = sorted({str(r["peer"]) for r in rows if r["role"] == "LEADER"})
    if out.json_mode:
        out.json({"brokerName": args.broker_name, "members": {str(k): v for k, v in status.items()},
                  "peers": rows, "leader": leaders[0] if len(leaders) == 1 else None})
    else:
        out.table(("PEER", "BROKER_ID", "ROLE", "TERM", "LEADER", "END_INDEX", "COMMITTED_INDEX", "LAG", "ADDR"),
                  [(r["peer"], r["brokerId"], r["role"], r["term"], r["leaderId"], r["ledgerEndIndex"],
                    r["committedIndex"], NA if r["lag"] is None else r["lag"], r["addr"]) for r in rows])
    for r in rows:
        if r["role"] == UNREACHABLE:
            out.warn(f"{args.broker_name}[{r['brokerId']}] at {r['addr']} did not answer: {r.get('error')}")
        elif r["role"] == DOWN:
            out.warn(f"peer {r['peer']} of {args.broker_name} is not registered with the nameserver (down?)")
    if not leaders:
        out.error(f"no member of {args.broker_name} leads (an election under way, or no quorum of members up)")
        return 1
    return 0


def cmd_dledger_transfer(args: argparse.Namespace, out: Output) -> int:
    """Hand the leadership of ``-b NAME`` to ``--to PEER``; returns once the route shows it as the master."""
    with open_admin(args) as adm:
        before = adm.dledger_status(args.broker_name).get(0) or {}
        new = adm.transfer_leadership(args.broker_name, args.to, timeout_s=args.timeout)
    if out.json_mode:
        out.json(new)
        return 0
    old = before.get("selfId", NA)
    if old == args.to:
        out.line(f"{args.to} already leads {args.broker_name} (term {new.get('term')}); nothing to do")
    else:
        out.line(f"leadership of {args.broker_name} moved from {old} to {args.to}: term {new.get('term')}, "
                 f"master {new.get('addr')}")
    return 0
