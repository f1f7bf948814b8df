"""Issue 37's acceptance: a master in a 256 MiB memory cgroup counts memory by its cgroup, not by its host.

``accessMessageInMemoryMaxRatio`` (40 %) of the host's RAM is gigabytes on any test machine, so a read of a few
hundred megabytes of history never looked cold, although a container of 256 MiB keeps at most 256 MiB of the
log in its page cache. Here the master runs inside a 256 MiB memory cgroup (joined before its first instruction,
so its page cache is charged there), about 250 MB are written, and a pull from offset 0 is sent to the slave
(``suggest_which_broker_id`` 1) while a pull at the tail stays on the master (0).

Needs root (or a delegated hierarchy) and a writable memory controller: skips, saying why, where there are none.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from client import Message, MessageQueue, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.confine import MemoryCgroup, cgroup_unavailable_reason, confine_prefix
from tests.ha.support import create_topic, fast

pytestmark = [pytest.mark.integration, pytest.mark.ha]

MIB = 1 << 20
LIMIT = 256 * MIB
TOPIC = "History"
#: 64 KiB bodies, 16 to a batch: 1 MiB per request, 240 requests for about 250 MB.
BODY = b"h" * (64 * 1024)
BATCHES = 240
PER_BATCH = 16


def test_a_master_in_a_256_mib_cgroup_sends_a_history_read_to_its_slave(tmp_path: Path) -> None:
    reason = cgroup_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a writable memory cgroup: {reason}")
    cluster = LocalCluster(tmp_path / "cluster", slaves_per_group=1, broker_config=fast(slaveReadEnable="true"),
                           commitlog_file_size_bytes=64 * MIB)
    master = cluster.broker("broker-a", 0)
    with MemoryCgroup.create(f"splitmq-test-{uuid.uuid4().hex[:8]}", LIMIT) as cgroup:
        master.command_prefix = confine_prefix(cgroup)
        with cluster:
            assert cgroup.pids() == [master.pid]
            # 40 % of the cgroup's 256 MiB, not of the host's RAM.
            assert master.runtime()["memoryForReadsBytes"] == int(LIMIT * 0.4)
            create_topic(cluster, TOPIC, queue_nums=1)
            mq = MessageQueue(TOPIC, "broker-a", 0)
            with Producer("history-writer", cluster.namesrv_addr) as p:
                for _ in range(BATCHES):
                    p.send_batch([Message(TOPIC, BODY) for _ in range(PER_BATCH)], queue=mq)
            written = int(master.runtime()["commitLogMaxOffset"])
            assert written > 250_000_000
            with PullConsumer("history-reader", cluster.namesrv_addr, connect_broker_by_user=True,
                              default_broker_id=0) as c:
                head = c.pull(mq, 0, max_nums=32)
                tail_offset = c.max_offset(mq) - 1
                tail = c.pull(mq, tail_offset, max_nums=32)
            # The whole log's memory could not be this process's page cache: the kernel kept it in bounds.
            assert cgroup.usage_bytes() <= LIMIT
    assert not os.path.exists(cgroup.path)
    assert (head.pull_status, head.served_by_broker_id, head.suggest_which_broker_id) == (PullStatus.FOUND, 0, 1), \
        f"a pull {written:,} bytes behind the log's end, in a {LIMIT >> 20} MiB cgroup: {head}"
    assert (tail.pull_status, tail.served_by_broker_id, tail.suggest_which_broker_id) == (PullStatus.FOUND, 0, 0), \
        f"a pull at the tail (offset {tail_offset}): {tail}"
