"""Filter pushdown of batch reads: the filters Spark offers a Python data source (``DataSourceReader.pushFilters``,
Spark 4.1+), turned into work the brokers do so less data leaves them. Pure: no I/O.

Spark hands over the conjuncts of a query's ``WHERE`` that compare one column with literals (``tags = 'A'``,
``tags IN (...)``, ``keys LIKE 'order-%'``, ``storeTimestamp >= ...``, ``queueOffset < ...``). It does not offer
filters on a map entry (``properties['region'] = 'EU'``): those stay in Spark, or are written as an SQL92
``subExpression`` with ``expressionType=SQL92``, which the brokers evaluate.

===================================== ==================================================== =============
filter                                what the brokers do                                  Spark re-checks
===================================== ==================================================== =============
``tags`` = / IN / <=> (TAG read)      the TAG subscription: the consume queue's tag hashes   no (exact: the
                                      skip other messages before the commit log is read      reader re-checks
                                                                                             tags as the SDK)
``tags``, ``keys``: = IN <> LIKE      an SQL92 condition on the ``TAGS`` / ``KEYS``           yes
``'x%'`` ``'%x'`` ``'%x%'``, IS       properties, evaluated by the broker on each candidate
[NOT] NULL (and ``tags`` with an      record (needs ``enablePropertyFilter=true``; a broker
SQL92 ``subExpression``)              that refuses it is read with the plain subscription)
``storeTimestamp`` < <= > >= =        each queue's range starts / ends at the offset the      yes (a broker
                                      broker's time search gives                             clock stepping
                                                                                             back breaks the
                                                                                             search's order)
``queueOffset`` < <= > >= = IN        each queue's range is cut                               no
``topic``, ``brokerName``,            queues not selected are not read at all                 no
``queueId`` = / IN
===================================== ==================================================== =============

Anything else (``bornTimestamp``, ``body``, ``msgId``, ``servedBy``...) is returned to Spark unchanged.
Filters on the same column combine (AND); contradictory ones (``tags = 'A' AND tags = 'B'``) plan no task.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from common.selector import SQL92
from spark_connector.offsets import OffsetMap, QueueKey

__all__ = ["Pushdown", "Subscription", "push_filters"]

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_US = datetime.timedelta(microseconds=1)
#: Our column name -> the property an SQL92 filter reads.
_SQL_PROPERTY = {"tags": "TAGS", "keys": "KEYS"}


def _literal(value: str) -> str:
    """An SQL92 string literal (``'`` doubled)."""
    return "'" + value.replace("'", "''") + "'"


def _epoch_us(value: object) -> int | None:
    """Microseconds since the epoch of an aware datetime (a naive one has no defined instant: not pushed)."""
    if isinstance(value, datetime.datetime) and value.tzinfo is not None:
        return (value - _EPOCH) // _US
    return None


def _ceil_ms(us: int) -> int:
    return -((-us) // 1000)


@dataclass(frozen=True)
class Subscription:
    """What one pull asks the broker to filter, and what the reader re-checks.

    ``expression``/``expression_type`` go on the wire; ``tags`` is the exact tag set the reader keeps (a TAG
    filter passes hash collisions); ``fallback`` is the subscription to use when a broker refuses the SQL92
    part that pushdown added (``enablePropertyFilter=false``): the filters it held are re-checked by Spark.
    """

    expression: str = "*"
    expression_type: str = "TAG"
    tags: frozenset[str] | None = None
    fallback: Subscription | None = None


@dataclass(frozen=True)
class Pushdown:
    """The filters a batch read took over (see the module docstring)."""

    tags: frozenset[str] | None = None
    """Only these tags (None: any)."""
    sql: tuple[str, ...] = ()
    """SQL92 conditions on TAGS / KEYS, AND-ed."""
    store_from_ms: int | None = None
    """First store time wanted (inclusive)."""
    store_until_ms: int | None = None
    """Store time the read stops before (exclusive)."""
    offset_from: int | None = None
    """First queue offset wanted (inclusive), every queue."""
    offset_until: int | None = None
    """Queue offset the read stops before (exclusive), every queue."""
    offsets_in: frozenset[int] | None = None
    """Only these queue offsets (``queueOffset IN (...)``): the range is cut to their span, Spark filters inside."""
    topics: frozenset[str] | None = None
    brokers: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    empty: bool = False
    """The filters contradict each other: nothing can match."""
    described: tuple[str, ...] = field(default=(), compare=False)
    """The pushed filters as text, for logs."""

    def keeps(self, key: QueueKey) -> bool:
        """Whether queue ``key`` may hold matching rows."""
        return not self.empty and all((
            self.topics is None or key.topic in self.topics,
            self.brokers is None or key.broker_name in self.brokers,
            self.queue_ids is None or key.queue_id in self.queue_ids,
        ))

    def cut(self, starts: OffsetMap, ends: OffsetMap) -> tuple[OffsetMap, OffsetMap]:
        """``(starts, ends)`` narrowed by the queue-offset bounds, queues not kept left out of ``ends``."""
        lo = self.offset_from
        hi = self.offset_until
        if self.offsets_in is not None:
            lo = max(lo or 0, min(self.offsets_in, default=0))
            hi = min(hi if hi is not None else 1 << 62, max(self.offsets_in, default=-1) + 1)
        new_starts = {k: max(v, lo) if lo is not None else v for k, v in starts.items()}
        new_ends = {k: min(v, hi) if hi is not None else v for k, v in ends.items() if self.keeps(k)}
        return new_starts, new_ends

    def subscription(self, user_expression: str, user_type: str) -> Subscription:
        """The subscription of each pull: the user's ``subExpression`` with the pushed filters added."""
        if user_type == SQL92:
            conditions = [f"({user_expression})"]
            if self.tags is not None:
                conditions.append(f"TAGS IN ({', '.join(_literal(t) for t in sorted(self.tags))})")
            conditions.extend(self.sql)
            plain = Subscription(user_expression, SQL92, self.tags)
            if len(conditions) == 1:
                return plain
            return Subscription(" AND ".join(conditions), SQL92, self.tags, fallback=plain)
        user_tags = _tag_set(user_expression)
        tags = self.tags if user_tags is None else (user_tags if self.tags is None else user_tags & self.tags)
        tag_sub = Subscription(" || ".join(sorted(tags)) if tags is not None else "*", "TAG", tags)
        if not self.sql:
            return tag_sub
        conditions = list(self.sql)
        if tags is not None:
            conditions.insert(0, f"TAGS IN ({', '.join(_literal(t) for t in sorted(tags))})")
        return Subscription(" AND ".join(conditions), SQL92, tags, fallback=tag_sub)


def _tag_set(expression: str) -> frozenset[str] | None:
    expr = expression.strip()
    if not expr or expr == "*":
        return None
    return frozenset(t.strip() for t in expr.split("||") if t.strip())


class _Builder:
    def __init__(self) -> None:
        self.tags: frozenset[str] | None = None
        self.sql: list[str] = []
        self.store_from: int | None = None
        self.store_until: int | None = None
        self.offset_from: int | None = None
        self.offset_until: int | None = None
        self.offsets_in: frozenset[int] | None = None
        self.sets: dict[str, frozenset[object]] = {}
        self.empty = False
        self.described: list[str] = []

    def only_tags(self, tags: Iterable[str]) -> None:
        got = frozenset(tags)
        self.tags = got if self.tags is None else self.tags & got
        self.empty |= not self.tags

    def only(self, column: str, values: Iterable[object]) -> None:
        got = frozenset(values)
        self.sets[column] = got if column not in self.sets else self.sets[column] & got
        self.empty |= not self.sets[column]

    def store_at_least(self, ms: int) -> None:
        self.store_from = ms if self.store_from is None else max(self.store_from, ms)

    def store_before(self, ms: int) -> None:
        self.store_until = ms if self.store_until is None else min(self.store_until, ms)

    def offset_at_least(self, n: int) -> None:
        self.offset_from = n if self.offset_from is None else max(self.offset_from, n)

    def offset_before(self, n: int) -> None:
        self.offset_until = n if self.offset_until is None else min(self.offset_until, n)


def _strings(values: object) -> list[str] | None:
    if isinstance(values, str):
        return [values]
    if isinstance(values, list | tuple) and values and all(isinstance(v, str) for v in values):
        return list(values)
    return None


def _ints(values: object) -> list[int] | None:
    items: list[object] = list(values) if isinstance(values, list | tuple) else [values]
    out = [v for v in items if isinstance(v, int) and not isinstance(v, bool)]
    return out if items and len(out) == len(items) else None


def _take(b: _Builder, f: object) -> bool | None:
    """Apply one filter; True: pushed and exact (Spark may drop it), False: pushed, Spark re-checks, None: not
    pushed."""
    name = type(f).__name__
    negated = name == "Not"
    if negated:
        f = getattr(f, "child", None)
        name = type(f).__name__
    attribute: tuple[str, ...] = tuple(getattr(f, "attribute", ()))
    if len(attribute) != 1:
        return None
    column = attribute[0]
    value = getattr(f, "value", None)
    if column in _SQL_PROPERTY:
        prop = _SQL_PROPERTY[column]
        strings = _strings(value)
        if negated:
            if name == "EqualTo" and strings and len(strings) == 1:
                b.sql.append(f"{prop} <> {_literal(strings[0])}")
                return False
            if name == "IsNull":
                b.sql.append(f"{prop} IS NOT NULL")
                return False
            return None
        if name in ("EqualTo", "EqualNullSafe", "In") and strings:
            if column == "tags":  # a TAG subscription, or TAGS IN (...) with an SQL92 one; the reader re-checks
                b.only_tags(strings)
                return True
            b.sql.append(f"{prop} IN ({', '.join(_literal(s) for s in strings)})")
            return False
        sql_op = {"StringStartsWith": "STARTSWITH", "StringEndsWith": "ENDSWITH", "StringContains": "CONTAINS"}
        if name in sql_op and isinstance(value, str):
            b.sql.append(f"{prop} {sql_op[name]} {_literal(value)}")
            return False
        if name in ("IsNull", "IsNotNull"):
            b.sql.append(f"{prop} IS {'NOT ' if name == 'IsNotNull' else ''}NULL")
            return False
        return None
    if negated:
        return None
    if column == "storeTimestamp":
        us = _epoch_us(value)
        if us is None:
            return None
        if name in ("GreaterThan", "GreaterThanOrEqual", "EqualTo"):
            b.store_at_least(us // 1000 + 1 if name == "GreaterThan" else _ceil_ms(us))
        if name in ("LessThan", "LessThanOrEqual", "EqualTo"):
            b.store_before(_ceil_ms(us) if name == "LessThan" else us // 1000 + 1)
        return False if name in ("GreaterThan", "GreaterThanOrEqual", "LessThan", "LessThanOrEqual",
                                 "EqualTo") else None
    if column == "queueOffset":
        ints = _ints(value)
        if ints is None:
            return None
        n = ints[0]
        if name == "GreaterThan":
            b.offset_at_least(n + 1)
        elif name == "GreaterThanOrEqual":
            b.offset_at_least(n)
        elif name == "LessThan":
            b.offset_before(n)
        elif name == "LessThanOrEqual":
            b.offset_before(n + 1)
        elif name == "EqualTo":
            b.offset_at_least(n)
            b.offset_before(n + 1)
        elif name == "In":
            got = frozenset(ints)
            b.offsets_in = got if b.offsets_in is None else b.offsets_in & got
            b.empty |= not b.offsets_in
            return False  # the range is cut to the span; Spark keeps exactly the listed offsets
        else:
            return None
        return True
    if column in ("topic", "brokerName") and name in ("EqualTo", "In"):
        strings = _strings(value)
        if strings is None:
            return None
        b.only(column, strings)
        return True
    if column == "queueId" and name in ("EqualTo", "In"):
        ints = _ints(value)
        if ints is None:
            return None
        b.only(column, ints)
        return True
    return None


def push_filters(filters: Sequence[object]) -> tuple[Pushdown, list[object]]:
    """Split Spark's filters into a :class:`Pushdown` and the filters Spark must still evaluate.

    Args:
        filters: ``pyspark.sql.datasource`` filter objects.

    Returns:
        ``(pushdown, for_spark)``: ``for_spark`` holds the filters not taken and those the brokers apply only
        approximately (the same objects, as Spark requires).
    """
    b = _Builder()
    for_spark: list[object] = []
    for f in filters:
        taken = _take(b, f)
        if taken is None or taken is False:
            for_spark.append(f)
        if taken is not None:
            b.described.append(repr(f))
    topics = b.sets.get("topic")
    brokers = b.sets.get("brokerName")
    queue_ids = b.sets.get("queueId")
    empty = b.empty or (b.store_from is not None and b.store_until is not None and b.store_from >= b.store_until) \
        or (b.offset_from is not None and b.offset_until is not None and b.offset_from >= b.offset_until)
    return Pushdown(
        tags=b.tags, sql=tuple(b.sql), store_from_ms=b.store_from, store_until_ms=b.store_until,
        offset_from=b.offset_from, offset_until=b.offset_until, offsets_in=b.offsets_in,
        topics=frozenset(str(t) for t in topics) if topics is not None else None,
        brokers=frozenset(str(t) for t in brokers) if brokers is not None else None,
        queue_ids=frozenset(int(str(q)) for q in queue_ids) if queue_ids is not None else None,
        empty=empty, described=tuple(b.described),
    ), for_spark
