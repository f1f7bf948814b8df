"""The sync and async twins of the SDK agree, so a change made to one and not the other fails here.

For each pair of public classes: the same public methods (``close`` <-> ``aclose`` where the project says so),
the same parameters (names, kinds, defaults, annotations once ``Async`` is dropped from names), a coroutine
exactly on the async side (but for the few methods that do no I/O), and docstrings on both. For every method
both classes still define for themselves, the bodies must be the same code once ``await``/``async`` are
stripped and ``Async`` names mapped to their sync names -- unless the pair is in :data:`DIFFER_BY_NATURE`, each
entry with its reason. The logic shared by the twins lives in the operations they both run
(``client/_ops.py``, ``_InstanceCore``), so most twins are one line each.
"""

from __future__ import annotations

import ast
import difflib
import inspect
import re
import textwrap
from typing import Any

import attrs
import pytest

from client import (
    AsyncClientInstance,
    AsyncGroupConsumer,
    AsyncProducer,
    AsyncPullConsumer,
    AsyncTransactionProducer,
    ClientInstance,
    GroupConsumer,
    Producer,
    PullConsumer,
    TransactionProducer,
)
from client._async_group_consumer import AsyncEngine
from client._group_consumer import SyncEngine
from client._transport import AsyncTransport, SyncTransport
from client.errors import BrokerError, ClientClosedError, ClientError
from client.lowlevel import AsyncBrokerClient, BrokerClient

_WAITS = "threads wait on a lock and a Condition; tasks on futures of the loop"
_LIFECYCLE = "a registry under a lock with a refresh thread vs one instance per event loop with a refresh task"
_SOCKETS = "blocking sockets under a Condition vs asyncio protocols and futures"
_THREADS_TASKS = "a lock, threads and threading.Events vs tasks and asyncio.Events of the loop"

#: Twin methods whose bodies differ by nature, keyed by the sync class and method name. Keep it short: logic
#: that is not about waiting or sockets belongs in an operation both twins run.
DIFFER_BY_NATURE: dict[tuple[str, str], str] = {
    ("Producer", "__init__"): _WAITS,
    ("Producer", "close"): _WAITS,
    ("Producer", "_send"): "the accumulator's waits: " + _WAITS,
    ("Producer", "_wait_room"): _WAITS,
    ("Producer", "_hand_on"): "wakes threads under the lock vs resolves futures",
    ("Producer", "send_async"): "a send on a thread of the producer's pool vs a task of the loop",
    ("Producer", "flush"): "waits for the pool's futures vs the loop's tasks",
    ("PullConsumer", "__init__"): "the sync consumer is shared by threads: it has a lock",
    ("PullConsumer", "close"): "the sync consumer is shared by threads: it has a lock",
    ("ClientInstance", "__init__"): _LIFECYCLE,
    ("ClientInstance", "acquire"): _LIFECYCLE,
    ("ClientInstance", "release"): _LIFECYCLE,
    ("ClientInstance", "close"): _LIFECYCLE,
    ("ClientInstance", "_background"): "waits on a threading.Event vs asyncio.wait_for on an asyncio.Event",
    ("SyncTransport", "__init__"): _SOCKETS,
    ("SyncTransport", "_pool"): _SOCKETS,
    ("SyncTransport", "_acquire"): _SOCKETS,
    ("SyncTransport", "_release_slot"): _SOCKETS,
    ("SyncTransport", "exchange"): "a blocking thread receives into its own reused buffer and lends large answers "
                                   "from it; a protocol receives into each response's parser",
    ("SyncTransport", "_put_back"): _SOCKETS,
    ("SyncTransport", "close"): _SOCKETS,
    ("SyncEngine", "__init__"): _THREADS_TASKS,
    ("SyncEngine", "start"): _THREADS_TASKS,
    ("SyncEngine", "close"): "joins its threads (a parked pull is left to end) vs cancels its tasks",
    ("SyncEngine", "_launch"): "a queue goes to the pull threads' scheduler vs gets a pull task of its own",
    ("SyncEngine", "_background"): "waits on a threading.Event vs asyncio.wait_for on an asyncio.Event",
    ("SyncEngine", "_pull_loop"): "a pull thread serves the scheduler's queues vs a task pulls its one queue",
    ("SyncEngine", "_call_listener"): "the async consumer awaits a rebalance listener that is a coroutine function",
    ("TransactionProducer", "__init__"): _THREADS_TASKS,
    ("TransactionProducer", "start"): "starts the supervisor thread under the lock vs its task",
    ("TransactionProducer", "close"): "joins its threads (a held poll is left to end) vs cancels its tasks",
    ("TransactionProducer", "_start_pollers"): "a poller thread per master, under the lock vs a task per master",
    ("TransactionProducer", "_pause"): "waits on a threading.Event vs asyncio.wait_for on an asyncio.Event",
    ("TransactionProducer", "_call"): "the async producer awaits a listener that is a coroutine function",
}


@attrs.frozen
class Twin:
    sync: type
    async_: type
    renames: dict[str, str] = attrs.field(factory=dict)
    """Sync name -> async name, where they differ (``close`` -> ``aclose``)."""
    only_sync: dict[str, str] = attrs.field(factory=dict)
    """Public names the async class does not have, with why."""
    plain_async: frozenset[str] = frozenset()
    """Async-side methods that are not coroutines: they do no I/O."""
    compare_bodies: bool = True


TWINS = [
    Twin(Producer, AsyncProducer, plain_async=frozenset({"send_async"})),
    Twin(PullConsumer, AsyncPullConsumer),
    Twin(ClientInstance, AsyncClientInstance, renames={"close": "aclose"},
         plain_async=frozenset({"acquire"})),
    Twin(SyncTransport, AsyncTransport, renames={"close": "aclose", "handle_request": "handle_async_request"}),
    Twin(BrokerClient, AsyncBrokerClient, renames={"close": "aclose"}),
    Twin(GroupConsumer, AsyncGroupConsumer,
         only_sync={"stats": "counters of the sync engine's pull threads; the async consumer has none"},
         plain_async=frozenset({"subscribe", "unsubscribe", "assign", "assignment", "pause", "resume", "__iter__"})),
    # The group consumers' engines: what both do is GroupEngine's (written once); the twins are how they wait.
    Twin(SyncEngine, AsyncEngine),
    Twin(TransactionProducer, AsyncTransactionProducer, renames={"close": "aclose"}),
]

_DUNDERS = {"__enter__": "__aenter__", "__exit__": "__aexit__", "__init__": "__init__", "__iter__": "__aiter__",
            "__next__": "__anext__"}
_NAME_MAP = {"aclose": "close", "__aenter__": "__enter__", "__aexit__": "__exit__", "__aiter__": "__iter__",
             "__anext__": "__next__", "StopAsyncIteration": "StopIteration",
             "handle_async_request": "handle_request", "aread": "read", "AsyncTransport": "SyncTransport",
             "AsyncEngine": "SyncEngine"}
_ASYNC_PREFIX = re.compile(r"\bAsync(?=[A-Z])")


def _norm_name(name: str) -> str:
    name = _NAME_MAP.get(name, name)
    return _ASYNC_PREFIX.sub("", name).removesuffix("_async")


class _Normalise(ast.NodeTransformer):
    """``await``/``async`` stripped, Async names mapped to sync names, docstrings dropped."""

    def visit_Await(self, node: ast.Await) -> Any:
        return self.visit(node.value)

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> ast.FunctionDef:
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            body = body[1:] or [ast.Pass()]
        fn = ast.FunctionDef(name=_norm_name(node.name), args=node.args, body=body,
                             decorator_list=node.decorator_list, returns=node.returns, type_comment=None)
        return self.generic_visit(fn)  # type: ignore[return-value]

    visit_FunctionDef = _function
    visit_AsyncFunctionDef = _function

    def visit_AsyncWith(self, node: ast.AsyncWith) -> Any:
        return self.generic_visit(ast.With(items=node.items, body=node.body))

    def visit_AsyncFor(self, node: ast.AsyncFor) -> Any:
        return self.generic_visit(ast.For(target=node.target, iter=node.iter, body=node.body, orelse=node.orelse))

    def visit_Name(self, node: ast.Name) -> Any:
        return ast.Name(id=_norm_name(node.id), ctx=node.ctx)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        return ast.Attribute(value=self.visit(node.value), attr=_norm_name(node.attr), ctx=node.ctx)

    def visit_Constant(self, node: ast.Constant) -> Any:
        if isinstance(node.value, str):
            return ast.Constant(_ASYNC_PREFIX.sub("", node.value))
        return node


def _normalised(fn: Any) -> str:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return ast.unparse(ast.fix_missing_locations(_Normalise().visit(tree)))


def _function(obj: Any) -> Any:
    if isinstance(obj, classmethod | staticmethod):
        return obj.__func__
    if isinstance(obj, property):
        return obj.fget
    return obj


def body_differences(sync: type, async_: type, renames: dict[str, str] | None = None) -> dict[str, str]:
    """Methods both classes define themselves whose normalised bodies differ: name -> a unified diff."""
    renames = {**_DUNDERS, **(renames or {})}
    out = {}
    for name, obj in vars(sync).items():
        twin = vars(async_).get(renames.get(name, name))
        fn, afn = _function(obj), _function(twin)
        if not inspect.isfunction(fn) or not inspect.isfunction(afn):
            continue
        a, b = _normalised(fn), _normalised(afn)
        if a != b:
            out[name] = "\n".join(difflib.unified_diff(a.splitlines(), b.splitlines(), f"{sync.__name__}.{name}",
                                                       f"{async_.__name__}.{name}", lineterm=""))
    return out


def _public(cls: type) -> set[str]:
    names = {n for n in dir(cls) if not n.startswith("_")}
    return names | {n for n in ("__enter__", "__exit__", "__aenter__", "__aexit__", "__iter__", "__next__",
                                "__aiter__", "__anext__") if hasattr(cls, n)}


def _params(fn: Any) -> list[tuple[str, Any, Any, str]]:
    sig = inspect.signature(fn)
    return [(p.name, p.kind, p.default, _ASYNC_PREFIX.sub("", str(p.annotation))) for p in sig.parameters.values()] \
        + [("->", None, None, _ASYNC_PREFIX.sub("", str(sig.return_annotation)))]


def _ids(twin: Twin) -> str:
    return twin.sync.__name__


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_same_public_surface(twin: Twin) -> None:
    renames = {**_DUNDERS, **twin.renames}
    expected = {renames.get(n, n) for n in _public(twin.sync) if n not in twin.only_sync}
    assert expected == _public(twin.async_), (
        f"{twin.sync.__name__} and {twin.async_.__name__} differ: only sync {sorted(expected - _public(twin.async_))}, "
        f"only async {sorted(_public(twin.async_) - expected)}")
    for name in twin.only_sync:
        assert hasattr(twin.sync, name) and not hasattr(twin.async_, name), f"stale only_sync entry {name}"


@pytest.mark.parametrize("twin", TWINS, ids=_ids)
def test_same_parameters_coroutines_and_docstrings(twin: Twin) -> None:
    renames = {**_DUNDERS, **twin.renames}
    checked = 0
    for name in sorted(_public(twin.sync) - twin.only_sync.keys()):
        sync_obj = inspect.getattr_static(twin.sync, name)
        async_obj = inspect.getattr_static(twin.async_, renames.get(name, name))
        if sync_obj is async_obj:
            continue  # shared by both (a core or base class): written once
        fn, afn = _function(sync_obj), _function(async_obj)
        if not fn.__module__.startswith("client"):
            continue  # httpx's, not ours
        where = f"{twin.sync.__name__}.{name}"
        assert name.startswith("__") or (fn.__doc__ and afn.__doc__), f"{where}: a docstring is missing on one side"
        if isinstance(sync_obj, property):
            assert isinstance(async_obj, property), f"{where} is a property on one side only"
            continue
        assert _params(fn) == _params(afn), f"{where}: parameters differ from its async twin"
        assert not inspect.iscoroutinefunction(fn), f"{where} is a coroutine on the sync side"
        assert inspect.iscoroutinefunction(afn) == (name not in twin.plain_async), (
            f"{where}: the async twin must be a coroutine exactly when it does I/O (plain: {sorted(twin.plain_async)})")
        checked += 1
    assert checked, "nothing compared"


@pytest.mark.parametrize("twin", [t for t in TWINS if t.compare_bodies], ids=_ids)
def test_twin_bodies_agree(twin: Twin) -> None:
    diffs = body_differences(twin.sync, twin.async_, twin.renames)
    unexpected = {n: d for n, d in diffs.items() if (twin.sync.__name__, n) not in DIFFER_BY_NATURE}
    assert not unexpected, "twin bodies drifted apart (change both, or move the logic into an operation):\n\n" \
        + "\n\n".join(unexpected.values())
    stale = [n for (cls, n) in DIFFER_BY_NATURE if cls == twin.sync.__name__ and n not in diffs]
    assert not stale, f"DIFFER_BY_NATURE lists {stale} of {twin.sync.__name__}, which no longer differ: remove them"


def test_allow_list_names_existing_twins() -> None:
    known = {t.sync.__name__: t for t in TWINS}
    for cls, name in DIFFER_BY_NATURE:
        assert cls in known and name in vars(known[cls].sync), f"DIFFER_BY_NATURE names unknown {cls}.{name}"


# --- the check itself can fail ----------------------------------------------------------------------------


class _SyncShell:
    def send_oneway(self, msg: str) -> None:
        try:
            self.send(msg)
        except (BrokerError, ClientError) as e:
            if isinstance(e, ClientClosedError):
                raise

    def send(self, msg: str) -> None:
        print(msg)


class _AsyncShell:
    async def send_oneway(self, msg: str) -> None:
        try:
            await self.send(msg)
        except ClientError as e:
            if isinstance(e, ClientClosedError):
                raise

    async def send(self, msg: str) -> None:
        print(msg)


def test_a_drift_between_twins_is_caught() -> None:
    # The drift issue 10 found: send_oneway caught (BrokerError, ClientError) in one twin, ClientError in the other.
    diffs = body_differences(_SyncShell, _AsyncShell)
    assert set(diffs) == {"send_oneway"}
    assert "except (BrokerError, ClientError) as e:" in diffs["send_oneway"]
