"""A chaos run's report: the figures, the rows of the benchmark table, and the list of failures (empty when the
run kept every promise: nothing acknowledged lost in SYNC mode or beyond the lag in ASYNC mode, no duplicate the
client's retries do not explain -- and with idempotent producers, no duplicate at all --, no reordering, no consumer
stuck, replicas identical, targets reached)."""

from __future__ import annotations

from collections import Counter

import attrs

from benchmarks import Row
from benchmarks.chaos.checker import Verdict
from benchmarks.chaos.nemesis import FaultKind, FaultRecord

__all__ = ["ChaosReport"]


@attrs.define
class ChaosReport:
    """Everything a run found (see the module docstring)."""

    profile: str
    mode: str
    disk: str
    seed: int
    root: str
    """The run's directory (logs of every process under ``cluster/logs``)."""
    faults: list[FaultRecord] = attrs.field(factory=list)
    verdict: Verdict = attrs.field(factory=Verdict)
    outcomes: dict[str, int] = attrs.field(factory=dict)
    """Messages by send outcome (SEND_OK, other statuses, error classes)."""
    stuck: list[str] = attrs.field(factory=list)
    """Queues whose consumer did not reach the end."""
    stalls: dict[str, float] = attrs.field(factory=dict)
    """Longest stall of each queue's consumer behind acknowledged messages, seconds."""
    consumed_from_slaves: int = 0
    consumer_gaps: int = 0
    consumer_rereads_differ: int = 0
    commitlog_diffs: int = 0
    errors: list[str] = attrs.field(factory=list)
    """The harness's own failures: a process that did not come back, a crash, a time limit."""
    duration_s: float = 0.0
    produce_s: float = 0.0
    targets: tuple[int, int] = (0, 0)
    """The profile's faults and acknowledged targets."""
    stuck_after_s: float = 15.0
    idempotent: bool = True
    """The producers were idempotent (issue 38): then no message may be stored twice, explained or not."""

    @property
    def faults_by_kind(self) -> Counter[FaultKind]:
        return Counter(f.spec.kind for f in self.faults)

    @property
    def exposed(self) -> int:
        """Acknowledged messages a slave lacked when its master went down, over every such fault."""
        return sum(f.exposed or 0 for f in self.faults)

    @property
    def longest_stall_s(self) -> float:
        return max(self.stalls.values(), default=0.0)

    def failures(self) -> list[str]:
        """Every broken promise, one line each (empty: a clean run)."""
        v = self.verdict
        out = list(self.errors)
        want_faults, want_acked = self.targets
        if len(self.faults) < want_faults:
            out.append(f"{len(self.faults)} faults, the profile needs {want_faults}")
        if v.acknowledged < want_acked:
            out.append(f"{v.acknowledged} acknowledged messages, the profile needs {want_acked}")
        checks = [("lost", v.lost), ("duplicated_unexplained", v.duplicated_unexplained),
                  ("duplicated_explained", v.duplicated_explained if self.idempotent else 0),
                  ("out_of_order", v.out_of_order), ("replica_mismatch", v.replica_mismatches),
                  ("consumer_mismatch", v.consumer_mismatches), ("foreign", v.foreign),
                  ("unreadable", v.unreadable)]
        for kind, n in checks:
            if n:
                out.append(f"{kind}: {n} (e.g. {'; '.join(v.examples.get(kind, []))})")
        if self.stuck:
            out.append(f"stuck consumers: {self.stuck}")
        stalled = {q: round(s, 1) for q, s in self.stalls.items() if s > self.stuck_after_s}
        if stalled:
            out.append(f"consumers stalled longer than {self.stuck_after_s} s: {stalled}")
        if self.consumer_gaps or self.consumer_rereads_differ:
            out.append(f"consumers skipped {self.consumer_gaps} offsets and were served "
                       f"{self.consumer_rereads_differ} offsets twice with different messages")
        if self.mode == "sync" and self.exposed:
            out.append(f"{self.exposed} acknowledged messages were not on the slave when their master went down "
                       f"(faults {[i for i, f in enumerate(self.faults) if f.exposed]})")
        if self.commitlog_diffs:
            out.append(f"commit logs of master and slave differ in {self.commitlog_diffs} MiB chunks")
        return out

    def rows(self) -> list[Row]:
        """The benchmark table."""
        v = self.verdict
        by_kind = self.faults_by_kind
        lag = max((f.lag.bytes for f in self.faults if f.lag is not None), default=0)
        rows = [Row(f"faults: {k.value}", float(by_kind[k]), "faults") for k in FaultKind]
        rows.append(Row("disk-full faults the broker met (refused a send / could not append)",
                        float(sum(1 for f in self.faults if f.bit)), "faults"))
        not_ok = sum(n for k, n in self.outcomes.items() if k != "SEND_OK")
        rows += [
            Row("faults, total", float(len(self.faults)), "faults", target=f">= {self.targets[0]:,}"),
            Row("acknowledged (SEND_OK)", float(v.acknowledged), "msgs", target=f">= {self.targets[1]:,}"),
            Row("sent, not acknowledged (other status or error)", float(not_ok), "msgs"),
            *(Row(f"  of which {k}", float(n), "msgs") for k, n in sorted(self.outcomes.items()) if k != "SEND_OK"),
            Row("stored on the masters (every copy)", float(v.stored), "msgs"),
            Row("lost (acknowledged, not readable)", float(v.lost), "msgs", target="0"),
        ]
        rows.append(Row("acknowledged, not on the slave when its master went down", float(self.exposed), "msgs",
                        target="0" if self.mode == "sync" else "within the lag"))
        if self.mode == "async":
            rows.append(Row("lost within the replication lag before a fault", float(v.lost_within_lag), "msgs"))
        rows += [
            Row("sent in more than one request by the client (retries)", float(v.resent), "msgs"),
            Row("duplicated, explained by client retries", float(v.duplicated_explained), "msgs",
                target="0 (idempotent producers)" if self.idempotent else ""),
            Row("duplicated, unexplained", float(v.duplicated_unexplained), "msgs", target="0"),
            Row("out of order (per producer, per queue)", float(v.out_of_order), "msgs", target="0"),
            Row("stuck consumers", float(len(self.stuck)), "queues", target="0"),
            Row("longest consumer stall behind stored messages", self.longest_stall_s, "s",
                target=f"< {self.stuck_after_s:.0f}"),
            Row("replica mismatches (slave vs master, per offset)", float(v.replica_mismatches), "offsets",
                target="0"),
            Row("replica queues starting late (empty slave joined at the last file, nothing acked below)",
                float(v.replica_late_starts), "queues"),
            Row("consumer mismatches (served vs stored, per offset)", float(v.consumer_mismatches), "offsets",
                target="0"),
            Row("commit-log chunks differing (master vs slave)", float(self.commitlog_diffs), "MiB", target="0"),
            Row("messages consumers were served by slaves", float(self.consumed_from_slaves), "msgs"),
            Row("largest replication lag before a fault", float(lag), "bytes"),
            Row("duration", self.duration_s, "s"),
            Row("acknowledged throughput while producing", v.acknowledged / self.produce_s if self.produce_s else 0.0,
                "msgs/s"),
        ]
        return rows

    def summary(self) -> str:
        """One paragraph: the run's settings, and its failures or "no failure"."""
        head = (f"chaos {self.profile} profile, {self.mode.upper()} mode, "
                f"{'idempotent' if self.idempotent else 'plain'} producers, disk {self.disk}, seed {self.seed}: "
                f"{len(self.faults)} faults, {self.verdict.acknowledged:,} acknowledged in {self.duration_s:.0f} s")
        fails = self.failures()
        if not fails:
            return head + "; no failure"
        return head + f"; FAILED (logs in {self.root}):\n  " + "\n  ".join(fails)
