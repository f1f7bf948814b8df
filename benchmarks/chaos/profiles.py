"""The chaos profiles: how many faults and acknowledged messages a run must reach, how it gets there, and the
bounds that stop it when it cannot.

* :data:`SHORT` (CI, ``python -m benchmarks chaos --quick``): at least 30 faults, about a minute on two cores;
* :data:`FULL` (``python -m benchmarks chaos``): at least 300 faults and 1,000,000 acknowledged messages, within
  30 minutes. Its producers are paced so that the messages are there by the time the faults are (a run that
  produced flat out would fill the tmpfs disks many times over).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

__all__ = ["FULL", "PROFILES", "SHORT", "Profile"]


@attrs.frozen
class Profile:
    """Targets, workload and bounds of one chaos run."""

    name: str
    faults: int
    """Faults to reach (the run goes on until this and ``acknowledged`` are both reached)."""
    acknowledged: int
    """SEND_OK messages to reach."""
    time_limit_s: float
    """Bound on the fault loop; reaching it before the targets fails the run."""
    hold_s: tuple[float, float]
    """Range of each fault's duration."""
    gap_s: tuple[float, float]
    """Range of the quiet time between two faults."""
    batch: int = 64
    """Messages per ``send_batch``."""
    batch_producers: int = 2
    """Threads sending with ``send_batch`` (one shared Producer)."""
    single_producers: int = 2
    """Threads sending with ``send`` (one shared Producer: their sends are batched by the SDK)."""
    batch_rate: float = 2000.0
    """Messages per second of each batch thread, at most."""
    single_rate: float = 200.0
    """Messages per second of each ``send`` thread, at most."""
    pad_bytes: int = 100
    """Body bytes after the key."""
    queues_per_group: int = 4
    commitlog_file_bytes: int = 256 << 10
    """Small commit-log files: a full tmpfs bites when the store allocates one (see ``ClusterSpec``)."""
    consume_queue_file_bytes: int = 60_000
    tmpfs_bytes: int = 256 << 20
    """Size of each broker's tmpfs (disk mode ``tmpfs``)."""
    stuck_after_s: float = 15.0
    """A consumer stalled this long behind acknowledged messages is stuck. A paused master holds its pulls for
    the pull timeout (3 s) and the hold; a killed one is left for a slave at once."""
    heal_timeout_s: float = 30.0
    """Bound on the cluster becoming whole after a fault."""
    settle_timeout_s: float = 120.0
    """Bound on the slaves catching up and dispatch finishing after the last fault."""
    drain_timeout_s: float = 120.0
    """Bound on the consumers reaching the end once the cluster settled."""
    broker_config: Mapping[str, str] = attrs.field(factory=dict)
    """More broker settings (experiments: ``attrs.evolve(SHORT, broker_config={...})``)."""


SHORT = Profile("short", faults=30, acknowledged=10_000, time_limit_s=150.0, hold_s=(0.2, 0.6), gap_s=(0.05, 0.3),
                batch=32, batch_rate=1000.0, single_rate=100.0)
FULL = Profile("full", faults=300, acknowledged=1_000_000, time_limit_s=1800.0, hold_s=(0.3, 1.5),
               gap_s=(0.2, 0.8), batch=64, batch_rate=1100.0, single_rate=150.0,
               consume_queue_file_bytes=600_000, tmpfs_bytes=1 << 30)
PROFILES = {p.name: p for p in (SHORT, FULL)}
