"""Issue 38's acceptance against real processes: an application loop re-sends each ``Message`` until SEND_OK
(threads sharing one idempotent ``Producer``, three with ``send`` and one with ``send_batch``) while

* the master of a SYNC_MASTER group is SIGKILLed and restarted at its address 5 times -- its slave paused before
  each kill until the master holds sends it has not answered, so every kill leaves stored messages whose re-sends
  reach the restarted master, which rebuilt its duplicate window from its log;
* the leader of a 3-member DLedger group is SIGKILLed 5 times (restarted once a new leader serves): the new
  leader holds entries whose sends the old one never answered.

Then every queue is read back from every member: every acknowledged message is there exactly once, at the queue
offset its SEND_OK named, and nothing else is. The scenarios are :mod:`benchmarks.idempotence_bench`'s, whose
``python -m benchmarks idempotence`` runs them longer and also with the brokers' window off
(``duplicateWindowMs=0``): then the same loop stores duplicates (tens over a few kills), which these tests count.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.idempotence_bench import dledger_leader_kills, sync_master_kills

pytestmark = [pytest.mark.integration, pytest.mark.ha, pytest.mark.slow]

KILLS = 5


@pytest.mark.timeout(300)
def test_resent_messages_are_stored_once_across_sync_master_kills(tmp_path: Path) -> None:
    report = sync_master_kills(tmp_path, rounds=KILLS)
    print("\n" + report.summary())
    assert report.kills == KILLS and report.acknowledged > 0
    assert report.clean, report.summary()
    assert set(report.lost) == {"master-0", "member-1"}  # both members read back


@pytest.mark.timeout(300)
def test_resent_messages_are_stored_once_across_dledger_leader_kills(tmp_path: Path) -> None:
    report = dledger_leader_kills(tmp_path, rounds=KILLS)
    print("\n" + report.summary())
    assert report.kills == KILLS and report.acknowledged > 0
    assert report.clean, report.summary()
    assert len(report.lost) == 3  # every member read back
