"""Commit-log replication between real broker processes, checked on disk (docs/BEHAVIOUR.md 2.4, 2.6).

(A frame at the wrong offset is covered in tests/broker/ha/test_replication.py.)
"""

from __future__ import annotations

import re
import shutil
import threading

import pytest

from client import Message, Producer
from tests.ha.support import (
    commitlog_files,
    create_topic,
    ha_cluster,
    max_offset,
    poll_until,
    produce,
    wait_slave_linked,
)

pytestmark = [pytest.mark.integration, pytest.mark.ha]

FILE_SIZE = 64 * 1024
BODY = b"r" * 1000
_STREAMING = re.compile(r"first report (\d+), streaming from (\d+)")


def assert_same_files(master_files: dict[int, bytes], slave_files: dict[int, bytes], first: int) -> None:
    assert min(slave_files) == first, (sorted(slave_files), first)
    for start, data in sorted(slave_files.items()):
        assert start in master_files, f"slave file {start} has no master twin"
        assert data == master_files[start], f"commit-log file {start} differs between master and slave"


def read_files(b: object) -> dict[int, bytes]:
    return {k: p.read_bytes() for k, p in commitlog_files(b).items()}  # type: ignore[arg-type]


def test_empty_slave_copies_the_masters_last_file_onwards_byte_for_byte(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, commitlog_file_size_bytes=FILE_SIZE)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    slave.stop()
    shutil.rmtree(slave.store_dir)
    create_topic(cluster, "Rep")
    produce(cluster.namesrv_addr, "Rep", 400)  # about six files
    before = max_offset(master)
    last_file = before - before % FILE_SIZE
    assert last_file >= 4 * FILE_SIZE
    slave.start()
    wait_slave_linked(cluster)
    produce(cluster.namesrv_addr, "Rep", 100)  # the live stream continues across a file boundary
    wait_slave_linked(cluster)
    assert max_offset(master) - last_file > FILE_SIZE
    assert_same_files(read_files(master), read_files(slave), last_file)
    assert max_offset(slave) == max_offset(master)


def test_slave_killed_mid_stream_resumes_from_its_own_offset(cluster_factory) -> None:
    cluster = ha_cluster(cluster_factory, slaves_per_group=1, commitlog_file_size_bytes=FILE_SIZE)
    master, slave = cluster.broker("broker-a", 0), cluster.broker("broker-a", 1)
    create_topic(cluster, "Mid")
    stop = threading.Event()
    errors: list[BaseException] = []

    def stream() -> None:
        try:
            with Producer("pg", cluster.namesrv_addr) as p:
                i = 0
                while not stop.is_set():
                    p.send_batch([Message("Mid", BODY + b"%d" % (i + j)) for j in range(8)])
                    i += 8
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=stream, daemon=True)
    t.start()
    try:
        poll_until(lambda: max_offset(slave) > 2 * FILE_SIZE, 30, "slave past two files")
        slave.kill()
        at_kill = max_offset(master)
        poll_until(lambda: max_offset(master) > at_kill + 2 * FILE_SIZE, 30, "master two files further")
        slave.start()
        poll_until(lambda: max_offset(slave) > at_kill + 2 * FILE_SIZE, 30, "restarted slave streaming")
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    wait_slave_linked(cluster)
    # Resumed from its own offset: every file from 0 is there and identical, none was skipped.
    assert_same_files(read_files(master), read_files(slave), 0)
    reports = [(int(a), int(b)) for a, b in _STREAMING.findall(master.log_path.read_text())]
    assert len(reports) >= 2 and reports[0] == (0, 0), reports
    resumed = reports[-1]
    assert resumed[0] == resumed[1] and 2 * FILE_SIZE < resumed[0] <= at_kill, (resumed, at_kill)
