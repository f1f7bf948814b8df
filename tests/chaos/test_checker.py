"""The chaos checker's rules, row by row, on hand-made ledgers and stored queues (no process).

Each rule must be able to fail: a loss, a duplicate the attempts do not explain, a reordering, a replica or a
consumer that differs from the master, a record that is no chaos message, an offset nobody serves.
"""

from __future__ import annotations

from array import array

import pytest

from benchmarks.chaos.checker import LagWindow, Verdict, judge
from benchmarks.chaos.ledger import Ledger, Location, make_key
from benchmarks.chaos.nemesis import FaultKind, FaultRecord, FaultSpec
from benchmarks.chaos.report import ChaosReport
from benchmarks.chaos.workload import GAP

Q = (0, 0)


def ledger(acks: list[int | None], attempts: list[int] | None = None) -> Ledger:
    """One producer; message i acknowledged at queue offset ``acks[i]`` of group 0 queue 0 (commit-log offset
    100 * offset), or not acknowledged (None)."""
    led = Ledger(1)
    led.reserve(0, len(acks))
    for seq, off in enumerate(acks):
        if off is not None:
            led.ack(0, seq, Location(0, 0, off), 100 * off)
    for seq, n in enumerate(attempts or [1] * len(acks)):
        led.attempts[0][seq] = n
    return led


def keys(*seqs: int) -> array[int]:
    return array("q", [s if s < 0 else make_key(0, s) for s in seqs])


def run(led: Ledger, master: array[int], *, slave: array[int] | None = None, consumed: array[int] | None = None,
        sync: bool = True, windows: tuple[LagWindow, ...] = ()) -> Verdict:
    same = array("q", master)
    return judge(led, {Q: master}, {Q: same if slave is None else slave}, {Q: same if consumed is None else consumed},
                 sync=sync, lag_windows=windows)


def test_a_clean_run_has_nothing_to_report() -> None:
    v = run(ledger([0, 1, 2]), keys(0, 1, 2))
    assert (v.acknowledged, v.stored, v.lost, v.duplicated_explained, v.duplicated_unexplained, v.out_of_order,
            v.replica_mismatches, v.consumer_mismatches, v.foreign, v.unreadable) == (3, 3, 0, 0, 0, 0, 0, 0, 0, 0)


@pytest.mark.parametrize(("stored", "lost"), [
    (keys(0, 1), 1),            # the last acknowledged message is missing
    (keys(0, 2, 1), 2),         # both are stored, each at the other's acknowledged offset
    (keys(0, 1, 2), 0),
])
def test_lost_means_not_at_its_acknowledged_offset(stored: array[int], lost: int) -> None:
    assert run(ledger([0, 1, 2]), stored).lost == lost


def test_an_unacknowledged_message_missing_is_no_loss() -> None:
    assert run(ledger([0, None, 1]), keys(0, 2)).lost == 0


@pytest.mark.parametrize(("sync", "window", "lost", "within"), [
    (False, LagWindow(0, 150, 250), 0, 1),   # ASYNC: the lost message (commit-log offset 200) was unreplicated
    (False, LagWindow(0, 0, 200), 1, 0),     # ASYNC: outside the window
    (False, LagWindow(1, 150, 250), 1, 0),   # ASYNC: another group's window
    (True, LagWindow(0, 150, 250), 1, 0),    # SYNC: every loss counts
])
def test_async_losses_within_the_lag_are_allowed(sync: bool, window: LagWindow, lost: int, within: int) -> None:
    v = run(ledger([0, 1, 2]), keys(0, 1), sync=sync, windows=(window,))
    assert (v.lost, v.lost_within_lag) == (lost, within)


@pytest.mark.parametrize(("attempts", "explained", "unexplained"), [
    ([1, 2], 1, 0),   # sent twice, stored twice: the client's retry
    ([1, 3], 1, 0),
    ([1, 1], 0, 1),   # sent once, stored twice: the broker stored or dispatched it twice
])
def test_duplicates_are_explained_only_by_attempts(attempts: list[int], explained: int, unexplained: int) -> None:
    v = run(ledger([0, 2], attempts), keys(0, 1, 1))
    assert (v.duplicated_explained, v.duplicated_unexplained) == (explained, unexplained)
    assert v.resent == sum(1 for a in attempts if a > 1)


def test_out_of_order_within_a_queue_is_found() -> None:
    led = ledger([1, 0])  # message 1 acknowledged below message 0, which the producer sent first
    v = run(led, keys(1, 0))
    assert v.out_of_order == 1 and v.lost == 0


def test_order_is_per_queue() -> None:
    led = Ledger(1)
    led.reserve(0, 2)
    led.ack(0, 0, Location(0, 0, 5), 0)
    led.ack(0, 1, Location(0, 1, 0), 0)  # another queue: a lower offset is no reordering
    v = judge(led, {(0, 0): keys(-1, -1, -1, -1, -1, 0), (0, 1): keys(1)}, {}, {}, sync=True)
    assert v.out_of_order == 0 and v.lost == 0


@pytest.mark.parametrize(("slave", "mismatches"), [
    (keys(0, 1, 2), 0),
    (keys(0, 2, 2), 1),     # another message at offset 1
    (keys(0, 1), 1),        # one offset short after the cluster settled
    (keys(0, 1, 2, 2), 1),  # one more
])
def test_replicas_must_serve_what_the_master_serves(slave: array[int], mismatches: int) -> None:
    assert run(ledger([0, 1, 2]), keys(0, 1, 2), slave=slave).replica_mismatches == mismatches


@pytest.mark.parametrize(("acks", "slave", "mismatches", "late"), [
    ([None, None, 2], keys(GAP, GAP, 2), 0, 1),   # empty slave joined at the master's last file: nothing it lacks was acked
    ([0, None, 2], keys(GAP, GAP, 2), 2, 0),      # message 0 was acknowledged: the replica must hold it
    ([None, 1, 2], keys(GAP, GAP, 2), 2, 0),      # so was message 1
    ([None, None, 2], keys(0, GAP, 2), 1, 0),     # not a leading run: a hole is a hole
])
def test_a_replica_may_start_late_only_below_every_acknowledged_message(
        acks: list[int | None], slave: array[int], mismatches: int, late: int) -> None:
    v = run(ledger(acks), keys(0, 1, 2), slave=slave)
    assert (v.replica_mismatches, v.replica_late_starts) == (mismatches, late)


def test_consumers_must_have_been_served_what_is_stored() -> None:
    v = run(ledger([0, 1, 2]), keys(0, 1, 2), consumed=keys(0, GAP, 2))
    assert v.consumer_mismatches == 1 and "consumer_mismatch" in v.examples


def test_foreign_records_and_unreadable_offsets_are_counted() -> None:
    v = run(ledger([0]), keys(0, -1, GAP))
    assert (v.foreign, v.unreadable) == (1, 1)


def test_the_report_turns_each_finding_into_a_failure() -> None:
    rep = ChaosReport(profile="t", mode="sync", disk="fault-layer", seed=1, root="/x", targets=(0, 0))
    assert rep.failures() == []
    rep.verdict = run(ledger([0, 1]), keys(0))
    assert [f.split(":")[0] for f in rep.failures()] == ["lost"]
    rep.stuck = ["broker-a/0 ended at 3 of 9"]
    rep.targets = (5, 0)
    assert len(rep.failures()) == 3


@pytest.mark.parametrize(("idempotent", "failures"), [(True, ["duplicated_explained"]), (False, [])])
def test_a_duplicate_the_retries_explain_fails_a_run_of_idempotent_producers(idempotent: bool,
                                                                              failures: list[str]) -> None:
    rep = ChaosReport(profile="t", mode="sync", disk="fault-layer", seed=1, root="/x", targets=(0, 0),
                      idempotent=idempotent)
    rep.verdict = run(ledger([0, 2], [1, 2]), keys(0, 1, 1))
    assert [f.split(":")[0] for f in rep.failures()] == failures


@pytest.mark.parametrize(("mode", "failures"), [("sync", 1), ("async", 0)])
def test_acknowledged_messages_a_slave_lacked_fail_only_a_sync_run(mode: str, failures: int) -> None:
    rep = ChaosReport(profile="t", mode=mode, disk="fault-layer", seed=1, root="/x", targets=(0, 0))
    spec = FaultSpec(FaultKind.KILL_MASTER, "broker-a", 0.1, 0.1)
    rep.faults = [FaultRecord(spec, 1.0, None, 0.5, exposed=0), FaultRecord(spec, 2.0, None, 0.5, exposed=3)]
    assert rep.exposed == 3 and len(rep.failures()) == failures
