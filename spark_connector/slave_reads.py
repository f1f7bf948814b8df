"""``pullFrom=slave`` on a broker group whose slaves do not serve reads: fail at planning, naming the key.

A slave with ``slaveReadEnable=false`` answers every pull by sending the reader back to its master while its
master is up (docs/HA.md, decision 6), and the reader obliges (a refusing slave is no reason to fail a query),
so a job asking for ``pullFrom=slave`` would read every row off the master with no word said. The driver asks
each group's slave (broker id 1, the member ``pullFrom=slave`` pins) for its ``GET /runtime`` once, when it
plans a batch read or a stream's first micro-batch: one request per group, before any row is read. That is
cheaper and more certain than spotting refusals in the executors' pull answers, which look like those of a
slave that simply has nothing new, and the route does not carry broker settings.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from client import Admin, ClientConfig
from client.errors import ClientError
from spark_connector.options import OptionError

log = logging.getLogger(__name__)

__all__ = ["SlaveReadsOffError", "check_slave_reads"]

#: The member ``pullFrom=slave`` reads from.
SLAVE_ID = 1


class SlaveReadsOffError(OptionError):
    """``pullFrom=slave`` against a broker group whose slave has ``slaveReadEnable=false``."""


def check_slave_reads(nameserver: str, routes: Mapping[str, Mapping[int, str]], *,
                      client_config: ClientConfig | None = None) -> None:
    """Raise when a group's slave would send ``pullFrom=slave`` reads back to its master.

    Args:
        nameserver: the ``nameserver`` option.
        routes: ``brokerName -> {brokerId: addr}`` of the topic (:func:`spark_connector.resolve.route_snapshot`).
        client_config: the account and TLS settings of the job's options (``accessKey``, ``tlsCaFile``).

    Raises:
        SlaveReadsOffError: some slave has ``slaveReadEnable=false``; the message names each and the key to set.
    """
    off: list[str] = []
    with Admin(nameserver, client_config=client_config) as admin:
        for name, members in sorted(routes.items()):
            addr = members.get(SLAVE_ID)
            if addr is None:
                log.warning("pullFrom=slave: broker group %s has no slave (id %d) in the route; its master serves",
                            name, SLAVE_ID)
                continue
            try:
                readable = admin.broker_runtime(addr).get("slaveReadEnable")
            except ClientError as e:  # down or unreachable: slaveFallback and the reader's retries deal with it
                log.warning("pullFrom=slave: could not ask %s[%d] (%s) whether it serves reads: %s", name, SLAVE_ID,
                            addr, e)
                continue
            if readable is False:
                off.append(f"{name}[{SLAVE_ID}] ({addr})")
    if off:
        raise SlaveReadsOffError(
            f"option pullFrom=slave, but slave reads are off on {', '.join(off)}: its master would serve every row. "
            f"Set slaveReadEnable=true in the broker group's broker.properties (master and slaves) and restart "
            f"it, or use pullFrom=auto"
        )
