"""The chaos nemesis: one fault at a time on a :class:`~benchmarks.chaos.cluster.ChaosCluster`, each held for a
while, healed, and followed by a wait until the cluster is whole again (bounded).

Kinds (:class:`FaultKind`), each on a master, a slave or the nameserver where it applies:

* ``kill``: SIGKILL, down for the hold, started again on the same store and ports;
* ``pause``: SIGSTOP for the hold (sockets stay open, nothing answers), then SIGCONT;
* ``restart``: SIGTERM (a graceful stop), down for the hold, started again;
* ``disk full``: the broker's disk fills for the hold (see the cluster), then has room again;
* ``cut HA link``: the group's master-slave connection is closed and refused for the hold.

:func:`plan` is the pure part: a seeded, endless sequence of faults in which every kind comes once per round, in
a shuffled order, on a random group, so a run of N rounds has N faults of each kind. One fault at a time keeps a
promise the workload relies on: every group always has a member up, so a consumer that waits long is stuck.
"""

from __future__ import annotations

import enum
import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator

import attrs

from benchmarks.chaos.cluster import ChaosCluster, Lag, Target

__all__ = ["FaultKind", "FaultRecord", "FaultSpec", "Nemesis", "plan"]

log = logging.getLogger(__name__)


class FaultKind(enum.Enum):
    """What the nemesis does, and to whom."""

    KILL_MASTER = "kill master"
    KILL_SLAVE = "kill slave"
    KILL_NAMESERVER = "kill nameserver"
    PAUSE_MASTER = "pause master"
    PAUSE_SLAVE = "pause slave"
    PAUSE_NAMESERVER = "pause nameserver"
    RESTART_MASTER = "restart master"
    RESTART_SLAVE = "restart slave"
    RESTART_NAMESERVER = "restart nameserver"
    DISK_FULL_MASTER = "disk full master"
    DISK_FULL_SLAVE = "disk full slave"
    CUT_HA_LINK = "cut HA link"

    @property
    def action(self) -> str:
        """``kill``, ``pause``, ``restart``, ``disk`` or ``cut``."""
        return self.name.split("_")[0].lower()

    @property
    def role(self) -> str:
        """``master``, ``slave``, ``nameserver`` or ``link``."""
        return "link" if self is FaultKind.CUT_HA_LINK else self.name.rsplit("_", 1)[1].lower()


@attrs.frozen
class FaultSpec:
    """One planned fault."""

    kind: FaultKind
    group: str
    """The broker group it hits (the nameserver's faults name one too: its lag is recorded)."""
    hold_s: float
    """How long the fault lasts."""
    gap_s: float
    """Quiet time after the cluster is whole again, before the next fault."""


def plan(rng: random.Random, groups: list[str], *, hold_s: tuple[float, float], gap_s: tuple[float, float],
         kinds: tuple[FaultKind, ...] = tuple(FaultKind)) -> Iterator[FaultSpec]:
    """An endless sequence of faults: each of ``kinds`` once per round, shuffled, on a random group."""
    while True:
        deck = list(kinds)
        rng.shuffle(deck)
        for kind in deck:
            yield FaultSpec(kind, rng.choice(groups), round(rng.uniform(*hold_s), 3), round(rng.uniform(*gap_s), 3))


@attrs.frozen
class FaultRecord:
    """One fault as it happened."""

    spec: FaultSpec
    at_s: float
    """Seconds since the run started."""
    lag: Lag | None
    """The group's replication state just before the fault (None: its master did not answer)."""
    heal_s: float
    """Seconds from the end of the hold until the cluster was whole again."""
    bit: bool | None = None
    """A full disk: whether the broker met it (refused a send, or could not append) before the heal."""
    exposed: int | None = None
    """A master killed or stopped: acknowledged messages its slave did not have once it was down (the ones a
    lost master disk would take with it). SYNC_MASTER promises 0."""


class Nemesis:
    """Applies faults to a cluster, one at a time.

    Args:
        cluster: the cluster.
        heal_timeout_s: bound on the cluster becoming whole after each fault.
        abort: set to cut a hold short (Ctrl-C, a failed run).
        disk_bite_timeout_s: how much longer than planned a full disk may last while waiting for the broker to
            meet it (on tmpfs, the store writes into the file it allocated ahead first).
        exposure: ``group -> acknowledged messages its slave lacks`` (None: unknown), asked once the group's
            master is down.
    """

    def __init__(self, cluster: ChaosCluster, *, heal_timeout_s: float, abort: threading.Event,
                 disk_bite_timeout_s: float = 5.0, exposure: Callable[[str], int | None] = lambda _: None) -> None:
        self.cluster = cluster
        self.exposure = exposure
        self.heal_timeout_s = heal_timeout_s
        self.disk_bite_timeout_s = disk_bite_timeout_s
        self.abort = abort
        self._t0 = time.monotonic()

    def _target(self, spec: FaultSpec) -> Target:
        role = spec.kind.role
        if role == "nameserver":
            return self.cluster.nameserver
        return self.cluster.master(spec.group) if role == "master" else self.cluster.slave(spec.group)

    def run(self, spec: FaultSpec) -> FaultRecord:
        """Inject, hold, heal, wait until whole; then the quiet gap.

        Raises:
            ChaosClusterError / ClusterError: a process did not come back, or the cluster did not become whole
                within ``heal_timeout_s``.
        """
        at = time.monotonic() - self._t0
        lag = self.cluster.lag(spec.group)
        log.info("fault %s on %s for %.2f s (lag %s)", spec.kind.value, spec.group, spec.hold_s, lag)
        heal, bitten = self._inject(spec)
        bit: bool | None = None
        exposed = None
        try:
            if spec.kind in (FaultKind.KILL_MASTER, FaultKind.RESTART_MASTER):
                exposed = self.exposure(spec.group)  # the master is down: nothing more gets acknowledged there
            self.abort.wait(spec.hold_s)  # the fault's duration
            if bitten is not None:  # a full disk counts once the broker met it
                deadline = time.monotonic() + self.disk_bite_timeout_s
                while not (bit := bitten()) and time.monotonic() < deadline and not self.abort.is_set():
                    time.sleep(0.05)  # polling the broker with a deadline
        finally:
            healed_at = time.monotonic()
            heal()
        self.cluster.wait_healthy(self.heal_timeout_s)
        record = FaultRecord(spec, at, lag, time.monotonic() - healed_at, bit, exposed)
        self.abort.wait(spec.gap_s)  # quiet time between faults
        return record

    def _inject(self, spec: FaultSpec) -> tuple[Callable[[], None], Callable[[], bool] | None]:
        """Start the fault; returns what ends it, and for a full disk the test that it was met."""
        c = self.cluster
        action = spec.kind.action
        if action == "cut":
            c.cut_link(spec.group)
            return (lambda: c.heal_link(spec.group)), None
        target = self._target(spec)
        if action == "kill":
            target.kill()
            return target.start, None
        if action == "restart":
            target.stop()
            return target.start, None
        if action == "pause":
            c.signal(target, signal.SIGSTOP)
            return (lambda: c.signal(target, signal.SIGCONT)), None
        broker = c.master(spec.group) if spec.kind.role == "master" else c.slave(spec.group)
        c.fill_disk(broker)
        return (lambda: c.free_disk(broker)), c.disk_bite(broker)
