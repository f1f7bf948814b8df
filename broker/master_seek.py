"""How a slave knows its master (docs/HA.md "How a slave finds its master", docs/DLEDGER.md "Reads from followers").

The decisions only, kept pure (state + event -> next state); the controller does the I/O and the waiting.

* **Classic slave.** As in RocketMQ, the master's client and HA addresses come in the nameserver's answer to the
  slave's registration. RocketMQ registers every ``registerNameServerPeriod`` (30 s), so a slave started before
  its master waits up to 30 s before it replicates, and a SYNC_MASTER answers ``SLAVE_NOT_AVAILABLE`` meanwhile.
  Here a slave that knows no master, or whose HA link is down while its HA address comes from the nameserver,
  registers again on a short back-off (:func:`seek_delay_s`: 0.5 s doubling to 2 s, +-20 % jitter) until the
  answer names a master and the link is up; then only the period remains. The first round after a new master
  address also runs the metadata sync at once (:func:`on_answer` says when).
* **DLedger follower.** Raft names the leader, and the leader's heartbeats carry its broker (HTTP) address, so a
  follower's master is the address of the leader it follows (:func:`follow_leader`), at once, without the
  nameserver; a change runs the metadata sync at once.
"""

from __future__ import annotations

import attrs

from broker.registration import RegisterResult

__all__ = ["SEEK_JITTER", "SEEK_MAX_S", "SEEK_MIN_S", "MasterSeek", "after_round", "follow_leader",
           "needs_master", "on_answer", "seek_delay_s"]

#: First re-ask delay of a slave that knows no master (s); doubles after every round that found none.
SEEK_MIN_S = 0.5
#: Bound of the re-ask delay (s): a master that comes up is known within about this (plus the jitter).
SEEK_MAX_S = 2.0
#: Share of the delay drawn at random either way, so slaves started together do not ask in step.
SEEK_JITTER = 0.2


@attrs.frozen
class MasterSeek:
    """What a classic slave knows of its master."""

    master_addr: str | None = None
    """The master's client address (metadata sync); None pauses the sync."""
    ha_addr: str | None = None
    """The master's HA address from the nameserver (None: none named yet)."""
    misses: int = 0
    """Re-asks in a row after which the slave still needed a master (drives the back-off)."""


def needs_master(seek: MasterSeek, *, link_up: bool, fixed_ha: bool) -> bool:
    """Whether the slave should ask the nameservers again now rather than at the next period: no master known,
    or the HA link down while the HA address comes from the nameserver (``haMasterAddress`` unset)."""
    return seek.master_addr is None or (not fixed_ha and not link_up)


def on_answer(seek: MasterSeek, result: RegisterResult) -> tuple[MasterSeek, bool]:
    """Fold one registration round's chosen answer in. Returns the new state and whether the metadata sync should
    run at once (the master's client address changed to a known one).

    The answer's client address replaces the known one (None: the master is not live, the sync pauses); its HA
    address replaces the known one only when given (the HA client keeps retrying the old master otherwise).
    """
    ha = result.ha_server_addr or seek.ha_addr
    changed = result.master_addr != seek.master_addr
    return (attrs.evolve(seek, master_addr=result.master_addr, ha_addr=ha),
            changed and result.master_addr is not None)


def after_round(seek: MasterSeek, *, still_needed: bool) -> MasterSeek:
    """Count a re-ask round: one more miss while a master is still needed, back to 0 once none is."""
    return attrs.evolve(seek, misses=seek.misses + 1 if still_needed else 0)


def seek_delay_s(misses: int, rand: float, *, min_s: float = SEEK_MIN_S, max_s: float = SEEK_MAX_S,
                 jitter: float = SEEK_JITTER) -> float:
    """The wait before the next re-ask after ``misses`` fruitless ones: ``min_s`` doubling, bounded by ``max_s``,
    times a factor in ``[1 - jitter, 1 + jitter)`` drawn from ``rand`` (uniform in [0, 1))."""
    base = max_s if misses >= 16 else min(max_s, min_s * (1 << misses))
    return base * (1.0 - jitter + 2.0 * jitter * rand)


def follow_leader(current: str | None, *, following: bool, leader_id: str | None,
                  leader_addrs: dict[str, str]) -> tuple[str | None, bool]:
    """A DLedger member's master client address after a change of its Raft role, leader, or a leader's announced
    broker address. Returns the address and whether the metadata sync should run at once (it changed to a known
    one).

    Args:
        current: the address it has now.
        following: the member is a FOLLOWER (a candidate or a leader has no master).
        leader_id: the leader it follows (None during an election).
        leader_addrs: each peer's broker address as its heartbeats announced it.
    """
    addr = leader_addrs.get(leader_id) if following and leader_id is not None else None
    return addr, addr is not None and addr != current
