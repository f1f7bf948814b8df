"""The chaos checker: read every queue back from every member, then judge the run against the ledger.

:func:`read_back` does the I/O (the SDK's low-level pulls, member by member); :func:`judge` is a pure function
of what was sent, what is stored and what the consumers saw, so its rules are table-tested:

* **lost**: acknowledged (SEND_OK), but its queue offset on the master holds another message or none. In ASYNC
  mode a loss is *within the lag* when its commit-log offset lies in a window the slave had not acked when a
  fault hit that group's master; in SYNC mode every loss counts. (A killed master comes back with what the page
  cache kept, so this read-back cannot see a SEND_OK given too early; the nemesis counts, when a master goes
  down, the acknowledged messages its slave lacks: ``FaultRecord.exposed``, 0 in SYNC mode.)
* **duplicated**: stored at more than one queue offset. A duplicate is *explained* when the client sent that
  message in at least as many ``POST /send`` requests as there are copies (a client retry after an answer
  that never arrived); anything more is a broker that stored or dispatched a message twice;
* **out of order**: two acknowledged messages of one producer in one queue whose queue offsets are not in the
  order the producer sent them (it waits for each answer before the next send);
* **replica mismatches**: a queue offset where the slave serves another key than the master, or offsets one
  of them lacks after the cluster settled;
* **consumer mismatches**: an offset where a consumer was served another key than the master holds, offsets a
  consumer was moved past, and consumers that did not reach the end (**stuck**, with the longest stall seen
  while the run was going).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from benchmarks.chaos.ledger import Ledger, Location, key_of, make_key, split_key
from benchmarks.chaos.workload import GAP
from client import MessageQueue, PullStatus
from client.lowlevel import BrokerClient
from common.codec import decode_records

__all__ = ["LagWindow", "QueueKeys", "Verdict", "compare_commitlogs", "judge", "read_back"]

#: Examples kept per kind of failure, for the report.
EXAMPLES = 5


@attrs.frozen
class LagWindow:
    """Commit-log bytes of a group the slave had not acked when a fault hit its master."""

    group: int
    start: int
    """The slave's ack offset."""
    end: int
    """The master's max offset."""


#: ``(group index, queue id) -> key at each queue offset`` as one member serves it.
QueueKeys = Mapping[tuple[int, int], "array[int]"]


def read_back(client: BrokerClient, addr: str, mq: MessageQueue, group: str, *, timeout_s: float = 60.0
              ) -> array[int]:
    """Every key of ``mq`` from offset 0 as the member at ``addr`` serves it: -1 for a record that is no chaos
    message, :data:`~benchmarks.chaos.workload.GAP` for an offset the member skipped.

    Raises:
        TransportError / BrokerError: the member failed to answer.
        AssertionError: the member refused an offset below its max, or the read did not end within ``timeout_s``.
    """
    keys = array("q")
    deadline = time.monotonic() + timeout_s
    while True:
        offset = len(keys)
        r = client.pull_raw_from(addr, mq, offset, group=group, max_nums=1024, max_bytes=4 << 20, timeout_s=10.0)
        if r.status is not PullStatus.FOUND:
            if offset >= r.max_offset:
                return keys
            if offset == 0 and 0 < r.min_offset < r.max_offset:
                # The member's queue starts later: a slave that was empty when it (re)connected took its
                # master's last file start (docs/BEHAVIOUR.md 2.6), so it never had what came before. The offsets below
                # its min are GAPs here; judge() allows them on a replica only where nothing was acknowledged.
                keys.extend([GAP] * r.min_offset)
                continue
            raise AssertionError(f"{addr} answered {r.status.value} for {mq} at {offset}, below its max "
                                 f"{r.max_offset}")
        for m in decode_records(r.records, broker_name=mq.broker_name):
            if m.queue_offset > len(keys):  # the stored record names its own queue offset
                keys.extend([GAP] * (m.queue_offset - len(keys)))
            if m.queue_offset == len(keys):
                keys.append(key_of(m.body))
        if len(keys) < r.next_begin_offset:
            keys.extend([GAP] * (r.next_begin_offset - len(keys)))
        if len(keys) == offset or time.monotonic() > deadline:
            raise AssertionError(f"reading {mq} back from {addr} stopped at offset {offset} "
                                 f"(answer {r.status.value}, next {r.next_begin_offset}, max {r.max_offset})")


@attrs.define
class Verdict:
    """What the checker found; every count but ``acknowledged`` and ``duplicated_explained`` must be 0."""

    acknowledged: int = 0
    stored: int = 0
    """Messages stored on the masters (every copy)."""
    lost: int = 0
    lost_within_lag: int = 0
    """ASYNC only: lost messages inside a :class:`LagWindow` (allowed)."""
    duplicated_explained: int = 0
    duplicated_unexplained: int = 0
    out_of_order: int = 0
    replica_mismatches: int = 0
    replica_late_starts: int = 0
    """Replica queues that start past offset 0 with nothing acknowledged below (an empty slave that joined at its
    master's last file: allowed, reported)."""
    consumer_mismatches: int = 0
    resent: int = 0
    """Messages the client sent in more than one request (its retries)."""
    foreign: int = 0
    """Stored records that are no chaos message (never expected)."""
    unreadable: int = 0
    """Offsets of a master's queue that served no record (never expected)."""
    examples: dict[str, list[str]] = attrs.field(factory=dict)

    def note(self, kind: str, text: str) -> None:
        ex = self.examples.setdefault(kind, [])
        if len(ex) < EXAMPLES:
            ex.append(text)


def _copies(ledger: Ledger, masters: QueueKeys, v: Verdict) -> list[bytearray]:
    """Copies of each message on the masters, per producer and sequence number (at most 255)."""
    copies = [bytearray(n) for n in ledger.sent]
    for (g, qid), keys in masters.items():
        for off, key in enumerate(keys):
            if key == GAP:
                v.unreadable += 1
                v.note("unreadable", f"group {g} queue {qid} offset {off}")
                continue
            if key < 0:
                v.foreign += 1
                v.note("foreign", f"group {g} queue {qid} offset {off}")
                continue
            p, seq = split_key(key)
            if p >= len(copies) or seq >= len(copies[p]):
                v.foreign += 1
                v.note("foreign", f"group {g} queue {qid} offset {off}: unknown key {p}.{seq}")
                continue
            v.stored += 1
            if copies[p][seq] < 255:
                copies[p][seq] += 1
    return copies


def _in_lag(windows: Sequence[LagWindow], group: int, phy: int) -> bool:
    return any(w.group == group and w.start <= phy < w.end for w in windows)


def judge(ledger: Ledger, masters: QueueKeys, slaves: QueueKeys, consumed: QueueKeys, *, sync: bool,
          lag_windows: Sequence[LagWindow] = ()) -> Verdict:
    """Judge a run (see the module docstring).

    Args:
        ledger: what was sent, acknowledged and attempted.
        masters: every queue as its master serves it after the run.
        slaves: every queue as its slave serves it after the run.
        consumed: every queue as the workload's consumer was served it.
        sync: SYNC_MASTER groups (every loss counts) or ASYNC_MASTER (losses within ``lag_windows`` are allowed).
        lag_windows: ASYNC: the unreplicated bytes of each group when a fault hit its master.
    """
    v = Verdict(acknowledged=ledger.acknowledged)
    copies = _copies(ledger, masters, v)
    for p, acked in enumerate(ledger.acked):
        last: dict[tuple[int, int], int] = {}
        for seq, packed in enumerate(acked):
            if packed < 0:
                continue
            at = Location.unpack(packed)
            q = (at.group, at.queue_id)
            keys = masters.get(q)
            if keys is None or at.queue_offset >= len(keys) or keys[at.queue_offset] != make_key(p, seq):
                phy = ledger.acked_phy[p][seq]
                if not sync and _in_lag(lag_windows, at.group, phy):
                    v.lost_within_lag += 1
                else:
                    v.lost += 1
                    v.note("lost", f"producer {p} seq {seq} acked at {at} (commit-log offset {phy})")
            if at.queue_offset <= last.get(q, -1):
                v.out_of_order += 1
                v.note("out_of_order", f"producer {p} seq {seq} at {at} after offset {last[q]}")
            last[q] = max(last.get(q, -1), at.queue_offset)
    v.resent = sum(1 for attempts in ledger.attempts for a in attempts if a > 1)
    for p, counts in enumerate(copies):
        attempts = ledger.attempts[p]
        for seq, n in enumerate(counts):
            if n > 1:
                if attempts[seq] >= n:
                    v.duplicated_explained += 1
                else:
                    v.duplicated_unexplained += 1
                    v.note("duplicated_unexplained", f"producer {p} seq {seq}: {n} copies, {attempts[seq]} attempts")
    acked_at = {(loc.group, loc.queue_id, loc.queue_offset)
                for acked in ledger.acked for packed in acked if packed >= 0
                for loc in (Location.unpack(packed),)}
    v.replica_mismatches = _differences(masters, _allowed_late_starts(slaves, acked_at, v), v, "replica",
                                        exact_length=True)
    v.consumer_mismatches = _differences(masters, consumed, v, "consumer", exact_length=True)
    return v


def _allowed_late_starts(slaves: QueueKeys, acked_at: set[tuple[int, int, int]], v: Verdict) -> QueueKeys:
    """The replicas' queues with a leading run of GAPs (a replica that started at its master's last file, having
    been empty when it connected) taken as the master's keys -- when no message in that run was acknowledged.
    An acknowledged message the replica lacks stays a mismatch: SYNC_MASTER answered SEND_OK for it only after
    this replica had stored it."""
    out: dict[tuple[int, int], array[int]] = {}
    for q, keys in slaves.items():
        lead = 0
        while lead < len(keys) and keys[lead] == GAP:
            lead += 1
        if lead and not any((q[0], q[1], off) in acked_at for off in range(lead)):
            v.replica_late_starts += 1
            v.note("replica_late_start", f"queue {q}: the replica starts at offset {lead} (nothing acknowledged "
                                         f"below it)")
            out[q] = _masked(keys, lead)
        else:
            out[q] = keys
    return out


def _masked(keys: array[int], lead: int) -> array[int]:
    """``keys`` with its first ``lead`` offsets marked as "not compared" (see :func:`_differences`)."""
    masked = array("q", keys)
    for i in range(lead):
        masked[i] = _SKIP
    return masked


#: In a compared queue: an offset not to compare (a replica's allowed late start).
_SKIP = -3


def _differences(masters: QueueKeys, other: QueueKeys, v: Verdict, kind: str, *, exact_length: bool) -> int:
    """Offsets where ``other`` serves another key than the master, plus offsets one of them lacks."""
    bad = 0
    for q, keys in masters.items():
        theirs = other.get(q, array("q"))
        n = min(len(keys), len(theirs))
        diff = sum(1 for i in range(n) if keys[i] != theirs[i] and theirs[i] != _SKIP)
        if diff:
            first = next(i for i in range(n) if keys[i] != theirs[i] and theirs[i] != _SKIP)
            v.note(f"{kind}_mismatch", f"queue {q}: {diff} offsets differ, first at {first}")
        missing = abs(len(keys) - len(theirs)) if exact_length else max(0, len(theirs) - len(keys))
        if missing:
            v.note(f"{kind}_mismatch", f"queue {q}: master has {len(keys)} offsets, the {kind} {len(theirs)}")
        bad += diff + missing
    return bad


def compare_commitlogs(master_dir: Path, slave_dir: Path, end: int, *, chunk: int = 1 << 20) -> int:
    """Bytes ranges (of ``chunk`` bytes) below ``end`` where the slave's commit-log files differ from the
    master's; a slave's commit log is a byte-for-byte copy from its first file on (docs/HA.md)."""
    bad = 0
    for path in sorted(slave_dir.iterdir()):
        if not path.name.isdigit():
            continue
        start = int(path.name)
        other = master_dir / path.name
        if start >= end:
            continue
        if not other.exists():
            return bad + 1
        with path.open("rb") as s, other.open("rb") as m:
            pos = start
            while pos < end:
                a, b = s.read(min(chunk, end - pos)), m.read(min(chunk, end - pos))
                if not a:
                    break
                bad += a != b
                pos += len(a)
    return bad
