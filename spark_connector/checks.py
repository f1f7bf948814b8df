"""Does a streaming query's checkpoint still fit the cluster? (``failOnDataLoss``; pure, tested on its own.)

A checkpoint holds, per queue, the next offset to read, and per broker group the identity of the store those
offsets came from (:mod:`spark_connector.offsets`, ``"@groups"``). Before a micro-batch is planned from it,
each checkpointed queue is compared with what the cluster holds now (:class:`~spark_connector.resolve.
QueueState`):

* **another store**: the group's identity now differs from the checkpoint's (a fresh cluster that reuses the
  group names, or a group whose store was wiped): every offset of that group is meaningless;
* **beyond the end**: the offset is above the queue's max offset as its *master* gives it (a slave's max trails
  its master's while the master is down, so there the reader just waits for the rest);
* **expired**: the offset is below the queue's min offset (retention deleted messages never read);
* **vanished**: the queue is no longer in the route (its topic lost read queues, or its whole group is gone).

With ``failOnDataLoss=true`` (the default) any of these fails the query with one line naming the queues, their
offsets, the option and what to do. With ``false`` they are logged and the query goes on from the earliest
offset each queue still holds (a vanished queue is dropped; it starts at its min offset if it comes back).

A group whose identity is unknown on either side (a checkpoint written before identities existed, a slave that
has not copied its master's yet) is checked by offsets alone.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from spark_connector.errors import DataLossError
from spark_connector.offsets import OffsetMap, QueueKey
from spark_connector.resolve import QueueState

log = logging.getLogger(__name__)

__all__ = ["check_checkpoint", "foreign_groups"]

#: Problems spelt out in one message before "and N more".
_SHOWN = 3


def _short(identity: str) -> str:
    return identity[:8] + "..."


def foreign_groups(checkpointed: Mapping[str, str], now: Mapping[str, str | None]) -> dict[str, tuple[str, str]]:
    """``brokerName -> (checkpoint's identity, current identity)`` for the groups whose store changed."""
    return {name: (old, cur) for name, old in sorted(checkpointed.items())
            if (cur := now.get(name)) is not None and cur != old}


def check_checkpoint(start: OffsetMap, groups: Mapping[str, str], state: QueueState, *, fail: bool,
                     what: str) -> OffsetMap:
    """The positions to go on from, after checking ``start`` against ``state`` (module docstring).

    Args:
        start: the checkpointed next offset of each queue.
        groups: the checkpoint's group identities (``"@groups"``; empty for older checkpoints).
        state: what the cluster holds now; ``state.maxs`` has every queue in the route now.
        fail: ``failOnDataLoss``.
        what: the read, as the message names it (``"topic Orders"``).

    Returns:
        ``start`` with every problem queue moved to its min offset, vanished queues left out.

    Raises:
        DataLossError: ``fail`` and a problem; the message's first line names the queues, the offsets,
            ``failOnDataLoss`` and what to do.
    """
    foreign = foreign_groups(groups, state.identities)
    problems: list[str] = []
    out: OffsetMap = {}
    moved: list[QueueKey] = []
    for name, (old, cur) in foreign.items():
        queues = sorted(k for k in start if k.broker_name == name)
        listed = ", ".join(f"{k}={start[k]}" for k in queues[:_SHOWN]) + (" ..." if len(queues) > _SHOWN else "")
        problems.append(f"broker group {name} holds another store than the checkpoint's (group identity "
                        f"{_short(cur)} now, {_short(old)} in the checkpoint: another cluster, or its store was "
                        f"wiped), so its checkpointed offsets {listed} mean nothing there")
    for k in sorted(start):
        off = start[k]
        if k not in state.maxs:
            problems.append(f"{k} (checkpointed at {off}) is no longer in the route")
            continue
        low, high = state.mins[k], state.maxs[k]
        if k.broker_name in foreign:
            out[k] = low
            moved.append(k)
        elif off < low:
            problems.append(f"{k} is checkpointed at offset {off}, below its min offset {low} (those messages "
                            f"expired unread)")
            out[k] = low
            moved.append(k)
        elif off > high and k.broker_name in state.from_master:
            problems.append(f"{k} is checkpointed at offset {off}, beyond its max offset {high}")
            out[k] = low
            moved.append(k)
        else:
            out[k] = off
    if not problems:
        return out
    shown = "; ".join(problems[:_SHOWN]) + (f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else "")
    if fail:
        raise DataLossError(
            f"the checkpoint of this query does not fit {what} any more: {shown}. Set failOnDataLoss=false to go "
            "on from the earliest offsets still there (what is gone is skipped), or give the query a new "
            "checkpointLocation")
    log.warning("the checkpoint does not fit %s any more: %s; failOnDataLoss=false: going on from the earliest "
                "offsets still there for %s", what, shown, ", ".join(map(str, moved)) or "no queue")
    return out
