"""The query arguments of ``GET /pull`` and ``POST /send``, described once (docs/PROTOCOL.md).

The SDK and the Spark connector build a request's path and query with :meth:`PullRequestHeader.target` /
:meth:`SendRequestHeader.target`; the broker reads the parsed query with ``from_query``, which checks every
argument and raises :class:`ArgumentError` (answered as INVALID_PARAMETER) naming the first bad one::

    GET  /pull?group=G&topic=T&queueId=Q&offset=O&maxNums=N&sysFlag=F&subExpression=E
               [&maxBytes=B][&commitOffset=C][&suspendTimeoutMs=S][&expressionType=SQL92]
    POST /send?topic=T&queueId=Q[&group=G][&reconsumeTimes=R][&defaultTopicQueueNums=N]

Optional arguments are written only when they differ from the broker's default (``expressionType`` only for
``SQL92``; TAG is the default), or, for ``commitOffset`` and
``suspendTimeoutMs``, when the flag bit that uses them is set), so ``from_query(parse(to_query(h))) == h``.
Queries are built as plain strings: httpx's ``params=`` cost about 50 µs a request on the data path.

Also here: the small argument readers the broker's other endpoints share (:func:`query_arg`,
:func:`query_int`, :func:`checked_name`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from urllib.parse import quote, unquote

import attrs

from common.codes import PULL_COMMIT_OFFSET, PULL_SUBSCRIPTION, PULL_SUSPEND, ResponseCode
from common.errors import ClientError, MessageIllegalError
from common.properties import validate_group, validate_topic
from common.selector import EXPRESSION_TYPES, TAG

__all__ = [
    "DEFAULT_PULL_MAX_BYTES",
    "DEFAULT_PULL_MAX_NUMS",
    "DEFAULT_SEND_TOPIC_QUEUE_NUMS",
    "DEFAULT_SUSPEND_TIMEOUT_MS",
    "INT32_MAX",
    "INT64_MAX",
    "MAX_PULL_MAX_NUMS",
    "ArgumentError",
    "CanonicalTarget",
    "PullRequestHeader",
    "SendRequestHeader",
    "checked_name",
    "parse_query",
    "query_arg",
    "query_int",
    "quote_arg",
]

INT32_MIN = -(2**31)
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
#: ``maxNums`` when a pull does not say (RocketMQ's ``pullBatchSize``).
DEFAULT_PULL_MAX_NUMS = 32
#: Largest ``maxNums`` a pull may ask for (the store's own batch limits apply first).
MAX_PULL_MAX_NUMS = 65_536
#: ``maxBytes`` when a pull does not say: RocketMQ 5's ``maxTotalMsgSize``.
DEFAULT_PULL_MAX_BYTES = 128 * 1024 * 1024
#: ``suspendTimeoutMs`` when a suspending pull does not say (RocketMQ's ``brokerSuspendMaxTimeMillis``).
DEFAULT_SUSPEND_TIMEOUT_MS = 15_000
#: ``defaultTopicQueueNums`` of a send that does not say (the SDK's ``defaultTopicQueueNums``).
DEFAULT_SEND_TOPIC_QUEUE_NUMS = 4


class ArgumentError(ClientError):
    """A request argument is missing or malformed (answered as INVALID_PARAMETER)."""

    code = int(ResponseCode.INVALID_PARAMETER)


class CanonicalTarget(str):
    """A request target whose query is already the canonical query a signature covers
    (:mod:`common.signing`): distinct argument names in sorted order, every value written by
    :func:`quote_arg`. The data path's request models return one, so the ACL's signer uses the query as it is
    instead of checking and sorting it again for every send and pull (``tests/protocol/test_requests.py`` checks
    that the general path agrees)."""

    __slots__ = ()


@functools.lru_cache(maxsize=4096)
def quote_arg(value: str) -> str:
    """Percent-encode a query value (topic names may hold ``%`` and ``|``, tag expressions spaces).

    Args:
        value: the raw value.

    Returns:
        The value with every byte outside ``[A-Za-z0-9_.~-]`` percent-encoded.
    """
    return quote(value, safe="")


def query_arg(query: Mapping[str, str], name: str, default: str | None = None) -> str:
    """A required (or defaulted) text argument.

    Args:
        query: the parsed query.
        name: the argument's name.
        default: its value when absent; None makes it required.

    Returns:
        The argument's value.

    Raises:
        ArgumentError: the argument is absent and has no default.
    """
    v = query.get(name, default)
    if v is None:
        raise ArgumentError(f"missing query argument {name!r}")
    return v


def query_int(query: Mapping[str, str], name: str, default: int | None = None, *, lo: int | None = None,
              hi: int | None = None) -> int:
    """A required (or defaulted) integer argument within ``[lo, hi]``.

    Args:
        query: the parsed query.
        name: the argument's name.
        default: its value when absent (not range-checked); None makes it required.
        lo: smallest accepted value (None: no bound).
        hi: largest accepted value (None: no bound).

    Returns:
        The argument's value.

    Raises:
        ArgumentError: absent without a default, not an integer, or outside ``[lo, hi]``.
    """
    raw = query.get(name)
    if raw is None:
        if default is None:
            raise ArgumentError(f"missing query argument {name!r}")
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ArgumentError(f"query argument {name!r}={raw[:40]!r} is not an integer") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        raise ArgumentError(f"query argument {name!r}={v} is outside [{lo}, {hi}]")
    return v


def checked_name(kind: str, value: str) -> str:
    """A topic or group argument, validated.

    Args:
        kind: ``"topic"`` or ``"group"`` (the argument's name, and which rule applies).
        value: the argument's value.

    Returns:
        ``value``.

    Raises:
        ArgumentError: the name is not legal (naming the argument and why).
    """
    try:
        return validate_topic(value) if kind == "topic" else validate_group(value)
    except MessageIllegalError as e:
        raise ArgumentError(f"query argument {kind!r}: {e.message}") from None


@attrs.frozen
class PullRequestHeader:
    """The arguments of one ``GET /pull`` (RocketMQ's ``PullMessageRequestHeader``)."""

    group: str
    """Consumer group (subscription group on the broker)."""
    topic: str
    """Topic of the queue."""
    queue_id: int
    """Queue id within the broker group."""
    offset: int
    """First logical offset wanted."""
    max_nums: int = DEFAULT_PULL_MAX_NUMS
    """Messages at most (the broker's ``maxTransferCount*`` caps apply too)."""
    max_bytes: int = DEFAULT_PULL_MAX_BYTES
    """Stored bytes at most (at least one message is returned whatever its size)."""
    sys_flag: int = 0
    """:class:`~common.codes.PullSysFlag` bits."""
    commit_offset: int = -1
    """The group's consumed offset to store on the master, used when ``COMMIT_OFFSET`` is set."""
    suspend_timeout_ms: int = DEFAULT_SUSPEND_TIMEOUT_MS
    """Long-poll bound when ``SUSPEND`` is set (the broker caps it with ``maxSuspendTimeoutMs``)."""
    sub_expression: str = "*"
    """``*`` or ``TagA || TagB``; an SQL92 filter when ``expression_type`` is ``SQL92``."""
    expression_type: str = TAG
    """``TAG`` or ``SQL92`` (:mod:`common.selector`)."""

    @classmethod
    def of(cls, group: str, topic: str, queue_id: int, offset: int, max_nums: int = DEFAULT_PULL_MAX_NUMS, *,
           sub_expression: str = "*", commit_offset: int | None = None, suspend_timeout_ms: int | None = None,
           max_bytes: int | None = None, expression_type: str = TAG) -> PullRequestHeader:
        """A consumer's pull, with the flag bits derived from what it carries (docs/BEHAVIOUR.md 3.3).

        Args:
            group: consumer group.
            topic: the queue's topic.
            queue_id: the queue's id.
            offset: first offset wanted.
            max_nums: messages at most.
            sub_expression: tag filter, or SQL92 filter with ``expression_type="SQL92"``.
            commit_offset: the group's offset to store on the master (sets ``COMMIT_OFFSET`` when >= 0; a pull
                to a slave must not carry one).
            suspend_timeout_ms: long polling up to this long (sets ``SUSPEND`` when > 0).
            max_bytes: stored bytes at most (the broker's default when None).
            expression_type: ``TAG`` or ``SQL92``.

        Returns:
            The header; ``SUBSCRIPTION`` is always set.
        """
        flag = PULL_SUBSCRIPTION
        commit = -1
        if commit_offset is not None and commit_offset >= 0:
            flag |= PULL_COMMIT_OFFSET
            commit = commit_offset
        suspend = DEFAULT_SUSPEND_TIMEOUT_MS
        if suspend_timeout_ms:
            flag |= PULL_SUSPEND
            suspend = suspend_timeout_ms
        return cls(group, topic, queue_id, offset, max_nums, DEFAULT_PULL_MAX_BYTES if max_bytes is None else max_bytes,
                   flag, commit, suspend, sub_expression, expression_type)

    def to_query(self) -> str:
        """The query string (without ``?``); see the module docstring for which arguments are written.

        Arguments are written sorted by name, as a signed request's canonical query has them
        (:mod:`common.signing`), so the ACL's signer sends this string as it is.
        """
        flag = self.sys_flag
        query = f"commitOffset={self.commit_offset}&" if flag & PULL_COMMIT_OFFSET else ""
        if self.expression_type != TAG:
            query += f"expressionType={quote_arg(self.expression_type)}&"
        query += f"group={quote_arg(self.group)}"
        if self.max_bytes != DEFAULT_PULL_MAX_BYTES:
            query += f"&maxBytes={self.max_bytes}"
        query += (f"&maxNums={self.max_nums}&offset={self.offset}&queueId={self.queue_id}"
                  f"&subExpression={quote_arg(self.sub_expression)}")
        if flag & PULL_SUSPEND:
            query += f"&suspendTimeoutMs={self.suspend_timeout_ms}"
        return f"{query}&sysFlag={flag}&topic={quote_arg(self.topic)}"

    def target(self) -> CanonicalTarget:
        """Path and query of the request."""
        return CanonicalTarget("/pull?" + self.to_query())

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> PullRequestHeader:
        """Read and check a pull's arguments, in the order the broker always checked them.

        Args:
            query: the parsed query (:func:`common.requests.parse_query`).

        Returns:
            The header.

        Raises:
            ArgumentError: an argument is missing, not an integer, out of range, or an illegal name.
        """
        return cls(
            group=checked_name("group", query_arg(query, "group")),
            topic=checked_name("topic", query_arg(query, "topic")),
            queue_id=query_int(query, "queueId", lo=INT32_MIN, hi=INT32_MAX),
            offset=query_int(query, "offset", lo=0, hi=INT64_MAX),
            max_nums=query_int(query, "maxNums", DEFAULT_PULL_MAX_NUMS, lo=1, hi=MAX_PULL_MAX_NUMS),
            max_bytes=query_int(query, "maxBytes", DEFAULT_PULL_MAX_BYTES, lo=1, hi=1 << 31),
            sys_flag=query_int(query, "sysFlag", 0, lo=0, hi=INT32_MAX),
            commit_offset=query_int(query, "commitOffset", -1, lo=-1, hi=INT64_MAX),
            suspend_timeout_ms=query_int(query, "suspendTimeoutMs", DEFAULT_SUSPEND_TIMEOUT_MS, lo=0, hi=INT32_MAX),
            sub_expression=query.get("subExpression", "*"),
            expression_type=_expression_type(query),
        )


def _expression_type(query: Mapping[str, str]) -> str:
    value = query.get("expressionType", TAG)
    if value not in EXPRESSION_TYPES:
        raise ArgumentError(f"query argument 'expressionType' must be one of {sorted(EXPRESSION_TYPES)}, "
                            f"got {value[:40]!r}")
    return value


@attrs.frozen
class SendRequestHeader:
    """The arguments of one ``POST /send`` (RocketMQ's ``SendMessageRequestHeader``); the body is a send batch.

    The topic's name is checked by the broker after its role and permission checks (MESSAGE_ILLEGAL, in
    RocketMQ's order), not by :meth:`from_query`.
    """

    topic: str
    """Destination topic."""
    queue_id: int
    """Destination queue id."""
    group: str = ""
    """Producer group ("" when none is named)."""
    reconsume_times: int = 0
    """Stored as the messages' ``RECONSUMETIMES`` (a consumer's own retry copy to ``%RETRY%<group>``)."""
    default_topic_queue_nums: int | None = None
    """Queues per group for a topic this send may auto-create (sent when the producer used the ``TBW102``
    route); None: not sent, the broker reads :data:`DEFAULT_SEND_TOPIC_QUEUE_NUMS`."""

    def to_query(self) -> str:
        """The query string (without ``?``), arguments sorted by name (as :meth:`PullRequestHeader.to_query`)."""
        nums = self.default_topic_queue_nums
        query = "" if nums is None else f"defaultTopicQueueNums={nums}&"
        if self.group:
            query += f"group={quote_arg(self.group)}&"
        query += f"queueId={self.queue_id}&"
        if self.reconsume_times:
            query += f"reconsumeTimes={self.reconsume_times}&"
        return f"{query}topic={quote_arg(self.topic)}"

    def target(self) -> CanonicalTarget:
        """Path and query of the request."""
        return CanonicalTarget("/send?" + self.to_query())

    @property
    def create_queue_nums(self) -> int:
        """Queues per group the producer asks for if this send creates the topic."""
        n = self.default_topic_queue_nums
        return DEFAULT_SEND_TOPIC_QUEUE_NUMS if n is None else n

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> SendRequestHeader:
        """Read and check a send's arguments, in the order the broker always checked them.

        Args:
            query: the parsed query (:func:`common.requests.parse_query`).

        Returns:
            The header.

        Raises:
            ArgumentError: an argument is missing, not an integer, out of range, or an illegal group name.
        """
        topic = query_arg(query, "topic")
        queue_id = query_int(query, "queueId", lo=INT32_MIN, hi=INT32_MAX)
        group = query.get("group", "")
        if group:
            checked_name("group", group)
        nums = query.get("defaultTopicQueueNums")
        return cls(
            topic=topic,
            queue_id=queue_id,
            group=group,
            reconsume_times=query_int(query, "reconsumeTimes", 0, lo=0, hi=INT32_MAX),
            default_topic_queue_nums=None if nums is None else query_int(query, "defaultTopicQueueNums", lo=1,
                                                                         hi=1024),
        )


def parse_query(qs: bytes) -> dict[str, str]:
    """A query string as a dict (last value wins, blank values kept), exactly as ``parse_qsl`` reads it.

    Only names and values holding ``%`` or ``+`` go through ``unquote``: parse_qsl unquotes every one and cost
    about 10 µs a request on the data path.
    """
    if not qs:
        return {}
    query: dict[str, str] = {}
    for field in qs.decode("latin-1").split("&"):
        if field:
            name, _, value = field.partition("=")
            if "%" in name or "+" in name:
                name = _unquote_plus(name)
            if "%" in value or "+" in value:
                value = _unquote_plus(value)
            query[name] = value
    return query


@functools.lru_cache(maxsize=512)
def _unquote_plus_short(text: str) -> str:
    return unquote(text.replace("+", " "))


def _unquote_plus(text: str) -> str:
    """``text`` decoded as a query name or value (``+`` is a space). Short ones come from a bounded cache: a
    consumer sends the same escaped value with every pull (``subExpression=%2A``), and ``unquote`` cost about 1 µs
    of the pull's ~2 µs query parse."""
    return _unquote_plus_short(text) if len(text) <= 64 else unquote(text.replace("+", " "))
