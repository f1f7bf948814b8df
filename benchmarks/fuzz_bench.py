"""Fuzzing of every input a SplitMQ server parses (issue 11 item 11): ``python -m benchmarks fuzz``.

Targets, each fed seeded mutations of valid inputs (and some generated from nothing):

* ``http-broker`` / ``http-nameserver``: every endpoint of a real broker and nameserver of a :class:`LocalCluster`
  on loopback, through a raw HTTP/1.1 socket (method, path, query and body mutated; deep nesting, huge numbers,
  bad UTF-8, wrong content types). An answer must not be 5xx, and a 4xx must carry a JSON RocketMQ code.
* ``send-batch``: the send-batch decoder in-process; only MessageIllegalError / ProtocolViolationError.
* ``ha-frames`` / ``ha-reports``: the slave's frame decoder plus its record checker, and the master's report
  decoder, in-process; only their documented errors.
* ``properties``: the ``.properties`` loader and the broker's config parsing; only their documented errors.

Afterwards the store must be intact (messages sent before fuzzing read back exactly), and the broker's RSS may
grow by less than 5 MiB from after a warm-up. A failure names its seed and input so it can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Callable
from typing import Any

import attrs
import psutil

from benchmarks import Row
from client import Admin, Message, Producer, PullConsumer, PullStatus
from client.cluster import LocalCluster
from client.errors import MessageIllegalError, ProtocolViolationError

__all__ = ["FULL", "SHORT", "FuzzReport", "mutate", "run", "run_fuzz"]

#: Inputs per target (HTTP targets count requests).
SHORT = {"http-broker": 1200, "http-nameserver": 300, "send-batch": 1500, "ha-frames": 1500, "ha-reports": 1000,
         "properties": 1000}
FULL = {"http-broker": 40_000, "http-nameserver": 10_000, "send-batch": 20_000, "ha-frames": 15_000,
        "ha-reports": 10_000, "properties": 10_000}
RSS_GROWTH_LIMIT = 5 * 1024 * 1024
_INTERESTING_INTS = [b"0", b"-1", b"1", b"2147483647", b"2147483648", b"-2147483649", b"9223372036854775807",
                     b"9223372036854775808", b"-9223372036854775809", b"1e400", b"NaN", b"0x10", b"99999999999999999999"]


def mutate(rng: random.Random, data: bytes) -> bytes:
    """One to four byte-level mutations of ``data``: flips, inserts, deletes, duplicated or spliced runs,
    interesting integers, deep nesting."""
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(9)
        pos = rng.randrange(len(b) + 1)
        if op == 0 and b:
            b[min(pos, len(b) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            b[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif op == 2 and b:
            del b[pos : pos + rng.randint(1, 16)]
        elif op == 3 and b:
            start = rng.randrange(len(b))
            b[pos:pos] = b[start : start + rng.randint(1, 64)] * rng.randint(1, 4)
        elif op == 4:
            b[pos:pos] = rng.choice(_INTERESTING_INTS)
        elif op == 5:
            depth = rng.choice([10, 1000, 50_000])
            b[pos:pos] = b"[" * depth + b"]" * depth
        elif op == 6:
            b[pos:pos] = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\x00", b"%", b"%zz", b"\r\n", b'"', b"\\u0000"])
        elif op == 7 and len(b) > 8:
            del b[pos:]  # truncation
        elif op == 8 and b:
            at = rng.randrange(len(b))
            b[at : at + 4] = rng.randrange(1 << 32).to_bytes(4, "big")
    return bytes(b)


@attrs.define
class TargetResult:
    inputs: int = 0
    ok: int = 0
    client_errors: int = 0
    server_errors: int = 0
    crashes: int = 0
    hangs: int = 0
    seconds: float = 0.0
    failures: list[str] = attrs.Factory(list)

    def fail(self, kind: str, seed: int, data: bytes, detail: str) -> None:
        if kind == "5xx":
            self.server_errors += 1
        elif kind == "hang":
            self.hangs += 1
        else:
            self.crashes += 1
        if len(self.failures) < 5:
            self.failures.append(f"{kind} seed={seed} input={data[:300]!r}: {detail[:300]}")


@attrs.define
class FuzzReport:
    targets: dict[str, TargetResult]
    rss_start: int = 0
    rss_end: int = 0
    store_intact: bool = False
    seed: int = 0

    @property
    def failures(self) -> list[str]:
        out = [f"{name}: {f}" for name, t in self.targets.items() for f in t.failures]
        if not self.store_intact:
            out.append("store: the messages sent before fuzzing did not read back exactly")
        if self.rss_end - self.rss_start >= RSS_GROWTH_LIMIT:
            out.append(f"rss: the broker grew by {(self.rss_end - self.rss_start) / 2**20:.1f} MiB")
        return out

    def rows(self) -> list[Row]:
        rows = []
        for name, t in self.targets.items():
            rows.append(Row(f"{name}: inputs ({t.client_errors} 4xx/refused, {t.server_errors} 5xx, "
                            f"{t.crashes} crashes, {t.hangs} hangs)", t.inputs, "inputs", target="0 5xx/crash/hang"))
        total = sum(t.inputs for t in self.targets.values())
        rows.append(Row("total inputs", total, "inputs", target=">= 100000 (full)"))
        rows.append(Row("broker RSS growth after warm-up (anonymous)", (self.rss_end - self.rss_start) / 2**20, "MiB",
                        target="< 5"))
        rows.append(Row("store intact afterwards", 1.0 if self.store_intact else 0.0, "bool", target="1"))
        return rows


# --------------------------------------------------------------------------------------------- HTTP targets
class _RawHttp:
    """One keep-alive HTTP/1.1 connection that sends arbitrary bytes; reconnects when the server closes."""

    def __init__(self, addr: str, timeout_s: float = 10.0) -> None:
        host, port = addr.rsplit(":", 1)
        self._where = (host, int(port))
        self._timeout = timeout_s
        self._sock: socket.socket | None = None

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def request(self, raw: bytes, *, head: bool = False) -> tuple[int, bytes] | None:
        """The status and body of the answer (``head``: a HEAD request, whose answer has no body), or None when
        the server closed without one (a refused request)."""
        if self._sock is None:
            self._sock = socket.create_connection(self._where, timeout=self._timeout)
        s = self._sock
        try:
            s.sendall(raw)
            return self._read(s, head)
        except (ConnectionError, BrokenPipeError, ValueError):
            self.close()
            return None

    def _read(self, s: socket.socket, head: bool) -> tuple[int, bytes] | None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                self.close()
                return None
            buf += chunk
        header, _, rest = buf.partition(b"\r\n\r\n")  # (not ``head``: that says whether this answers a HEAD)
        lines = header.split(b"\r\n")
        parts = lines[0].split()
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ConnectionError(f"not an HTTP answer: {lines[0][:80]!r}")
        status = int(parts[1])
        length = 0
        close = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
            elif name.strip().lower() == b"connection" and value.strip().lower() == b"close":
                close = True
        if head:
            length = 0
        while len(rest) < length:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        if close or head or len(rest) > length:
            self.close()  # a HEAD answer may leave the request's body unread: start the next one afresh
        return status, rest[:length]


def _request(method: bytes, path: bytes, query: bytes, body: bytes, content_type: bytes = b"application/json"
             ) -> bytes:
    target = path + (b"?" + query if query else b"")
    return (method + b" " + target + b" HTTP/1.1\r\nHost: fuzz\r\nContent-Type: " + content_type
            + b"\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)


def _broker_seeds(topic: str) -> list[tuple[bytes, bytes, bytes, bytes]]:
    batch = _seed_batch(topic)
    j = json.dumps
    return [
        (b"POST", b"/send", f"topic={topic}&queueId=0".encode(), batch),
        (b"GET", b"/pull", f"topic={topic}&group=fg&queueId=0&offset=0&maxNums=4".encode(), b""),
        (b"POST", b"/topic", b"", j({"topicName": "FuzzNew", "readQueueNums": 2, "writeQueueNums": 2}).encode()),
        (b"POST", b"/subscription-group", b"", j({"groupName": "fg2", "retryMaxTimes": 3}).encode()),
        (b"POST", b"/heartbeat", b"", j({"clientId": "c1", "producerGroups": ["pg"], "consumerGroups": [
            {"group": "fg", "subscriptions": [{"topic": topic, "subExpression": "*"}]}]}).encode()),
        (b"POST", b"/client/unregister", b"", j({"clientId": "c1", "producerGroup": "pg"}).encode()),
        (b"POST", b"/offset/consumer", b"", j({"group": "fg", "offsets": [{"topic": topic, "queueId": 0,
                                                                          "offset": 1}]}).encode()),
        (b"POST", b"/consumer/sendback", b"", j({"group": "fg", "offset": 0, "delayLevel": 1}).encode()),
        (b"GET", b"/offset/consumer", f"group=fg&topic={topic}&queueId=0".encode(), b""),
        (b"GET", b"/offset/max", f"topic={topic}&queueId=0".encode(), b""),
        (b"GET", b"/offset/min", f"topic={topic}&queueId=0".encode(), b""),
        (b"GET", b"/offset/search", f"topic={topic}&queueId=0&timestamp=1".encode(), b""),
        (b"GET", b"/offset/storetime", f"topic={topic}&queueId=0&offset=0".encode(), b""),
        (b"GET", b"/message", b"offset=0&size=200", b""),
        (b"GET", b"/message/key", f"topic={topic}&key=k1&maxNum=4".encode(), b""),
        (b"GET", b"/message/uniq", f"topic={topic}&uniqKey=AB".encode(), b""),
        (b"GET", b"/consumer/ids", b"group=fg", b""),
        (b"GET", b"/consumer/pulls", b"group=fg", b""),
        (b"GET", b"/offsets", b"", b""), (b"GET", b"/topics", b"", b""), (b"GET", b"/subscription-groups", b"", b""),
        (b"GET", b"/delay-offsets", b"", b""), (b"GET", b"/runtime", b"", b""), (b"GET", b"/ha", b"", b""),
        (b"GET", b"/metrics", b"", b""),
    ]


def _nameserver_seeds(broker_addr: str) -> list[tuple[bytes, bytes, bytes, bytes]]:
    j = json.dumps
    reg = {"clusterName": "FuzzCluster", "brokerAddr": "127.0.0.1:1", "brokerName": "fuzz-b", "brokerId": 0,
           "haServerAddr": "127.0.0.1:2", "topicConfigWrapper": {"dataVersion": {"timestamp": 1, "counter": 1},
                                                                  "topicConfigTable": {}}}
    return [
        (b"POST", b"/broker/register", b"", j(reg).encode()),
        (b"POST", b"/broker/unregister", b"", j({"clusterName": "FuzzCluster", "brokerAddr": "127.0.0.1:1",
                                                 "brokerName": "fuzz-b", "brokerId": 0}).encode()),
        (b"POST", b"/broker/wipe-write-perm", b"", j({"brokerName": "fuzz-b"}).encode()),
        (b"POST", b"/broker/add-write-perm", b"", j({"brokerName": "fuzz-b"}).encode()),
        (b"GET", b"/route", b"topic=FuzzT", b""), (b"GET", b"/cluster", b"", b""),
    ]


def _fuzz_http(res: TargetResult, addr: str, seeds: list[tuple[bytes, bytes, bytes, bytes]], n: int,
               rng: random.Random, seed: int) -> None:
    conn = _RawHttp(addr)
    methods = [b"GET", b"POST", b"PUT", b"DELETE", b"HEAD", b"OPTIONS"]
    paths = [s[1] for s in seeds]
    started = time.monotonic()
    try:
        for i in range(n):
            method, path, query, body = seeds[i % len(seeds)]
            which = rng.randrange(6)
            if which == 0:
                body = mutate(rng, body)
            elif which == 1:
                query = mutate(rng, query)
            elif which == 2:
                method, path = rng.choice(methods), rng.choice(paths)
                body = mutate(rng, body)
            elif which == 3:
                body = rng.randbytes(rng.randrange(2048))
            elif which == 4:
                path = mutate(rng, path).replace(b" ", b"%20").replace(b"\r", b"").replace(b"\n", b"") or b"/"
                if not path.startswith(b"/"):
                    path = b"/" + path
            else:
                query, body = mutate(rng, query), mutate(rng, body)
            query = query.replace(b" ", b"+").replace(b"\r", b"").replace(b"\n", b"").replace(b"#", b"")
            raw = _request(method, path, query, body)
            res.inputs += 1
            try:
                answer = conn.request(raw, head=method == b"HEAD")
            except TimeoutError:
                res.fail("hang", seed, raw, "no answer within 10 s")
                conn.close()
                continue
            if answer is None:
                res.client_errors += 1  # refused by closing (a request line the HTTP parser rejects)
                continue
            status, data = answer
            if status >= 500:
                res.fail("5xx", seed, raw, f"{status} {data[:200]!r}")
            elif status >= 400:
                res.client_errors += 1
                if method != b"HEAD" and not _is_coded_error(data):
                    res.fail("crash", seed, raw, f"{status} without a RocketMQ code: {data[:200]!r}")
            else:
                res.ok += 1
    finally:
        conn.close()
        res.seconds += time.monotonic() - started


def _is_coded_error(data: bytes) -> bool:
    try:
        return isinstance(json.loads(data).get("code"), int)
    except (ValueError, AttributeError, RecursionError):
        return False


# ------------------------------------------------------------------------------------------ in-process targets
def _seed_batch(topic: str) -> bytes:
    from common.codec import encode_batch

    return encode_batch([Message(topic, b"fuzz-%d" % i, tags="A", keys=f"k{i}") for i in range(3)],
                        born_timestamp_ms=1)


def _fuzz_calls(res: TargetResult, seeds: list[bytes], n: int, rng: random.Random, seed: int,
                call: Callable[[bytes], object], allowed: tuple[type[BaseException], ...]) -> None:
    started = time.monotonic()
    for i in range(n):
        data = mutate(rng, seeds[i % len(seeds)]) if i % 10 else rng.randbytes(rng.randrange(512))
        res.inputs += 1
        t0 = time.monotonic()
        try:
            call(data)
            res.ok += 1
        except allowed:
            res.client_errors += 1
        except Exception as e:  # anything else is a crash of the parser
            res.fail("crash", seed, data, f"{type(e).__name__}: {e}")
        if time.monotonic() - t0 > 2.0:
            res.fail("hang", seed, data, f"took {time.monotonic() - t0:.1f} s")
    res.seconds += time.monotonic() - started


def _ha_frames_call(file_size: int) -> Callable[[bytes], object]:
    from broker.ha.protocol import FrameDecoder
    from broker.store.records import ReplicaChecker

    def call(data: bytes) -> object:
        dec = FrameDecoder(capacity=1 << 16)
        checker = ReplicaChecker(file_size, 4096)
        out: list[Any] = []
        for frame in dec.feed(data):
            if checker.next_offset == 0 and frame.phy_offset != 0:
                checker.reset(frame.phy_offset - frame.phy_offset % file_size)
            if frame.phy_offset == checker.next_offset:
                checker.feed(frame.body, out)
        return out

    return call


def _ha_frame_seeds(file_size: int) -> list[bytes]:
    from broker.ha.protocol import encode_frame_header
    from common.codec import decode_batch, pack_host, write_batch_records

    seeds = []
    items = decode_batch(_seed_batch("HaT"))
    buf = bytearray(4096)
    ends = write_batch_records(buf, 0, 0, topic=b"HaT", queue_id=0, first_queue_offset=0, items=items,
                               born_host=pack_host("127.0.0.1", 1), store_timestamp=1,
                               store_host=pack_host("127.0.0.1", 2))
    body = bytes(buf[: max(ends)]) if ends and max(ends) > 0 else bytes(buf[:600])
    seeds.append(encode_frame_header(0, len(body)) + body)
    seeds.append(encode_frame_header(0, 0))
    seeds.append(encode_frame_header(file_size, len(body)) + body)
    return seeds


def _properties_call(data: bytes) -> object:
    from broker.config import load_config
    from broker.properties_file import parse_properties

    props = parse_properties(data.decode("utf-8", "replace"))
    with tempfile.NamedTemporaryFile("w", suffix=".properties", delete=False) as f:
        f.write(data.decode("utf-8", "replace"))
    try:
        return load_config(f.name, env={}) if props is not None else None
    finally:
        os.unlink(f.name)


# ------------------------------------------------------------------------------------------------ the run
def _store_intact(cluster: LocalCluster, topic: str, sent: list[bytes]) -> bool:
    """Every message sent before fuzzing reads back exactly once (the fuzzer's own valid sends add others)."""
    with PullConsumer("fuzz-check", cluster.namesrv_addr) as c:
        got: list[bytes] = []
        for mq in c.fetch_subscribe_message_queues(topic):
            offset = 0
            while True:
                r = c.pull(mq, offset, 32)
                if r.pull_status is not PullStatus.FOUND:
                    break
                got.extend(m.body for m in r.msg_found_list)
                offset = r.next_begin_offset
    known = set(sent)
    return sorted(b for b in got if b in known) == sorted(sent)


def _anon_rss(proc: psutil.Process) -> int:
    """Resident memory that is not file-backed: the store's mapped pages (the commit log the fuzzer's valid sends
    fill) are page cache, not growth of the process."""
    info = proc.memory_info()
    return int(info.rss - getattr(info, "shared", 0))


def run_fuzz(profile: dict[str, int], *, seed: int | None = None) -> FuzzReport:
    """Fuzz every target ``profile`` names, as many inputs as it says, against a fresh local cluster."""
    from broker.config import ConfigError
    from broker.ha.protocol import HAProtocolError, ReportDecoder
    from broker.properties_file import PropertiesSyntaxError
    from broker.store.records import RecordViolation
    from common.codec import decode_batch

    seed = random.randrange(1 << 32) if seed is None else seed
    rng = random.Random(seed)
    report = FuzzReport({name: TargetResult() for name in profile}, seed=seed)
    with tempfile.TemporaryDirectory(prefix="splitmq-fuzz-") as root, \
            LocalCluster(root, slaves_per_group=0, broker_config={"messageIndexEnable": "false"}) as cluster:
        topic = "FuzzT"
        broker = cluster.broker("broker-a", 0)
        sent = [b"before-%d" % i for i in range(50)]
        with Admin(cluster.namesrv_addr) as admin:  # autoCreateTopicEnable is off: a send never creates a topic
            admin.create_topic(topic, queue_nums=4)
        with Producer("fuzz-p", cluster.namesrv_addr) as p:
            for body in sent:
                p.send(Message(topic, body))
        proc = psutil.Process(broker.pid)
        warm = max(1, profile.get("http-broker", 0) // 10)
        http = report.targets.get("http-broker")
        if http is not None:
            _fuzz_http(http, broker.addr, _broker_seeds(topic), warm, rng, seed)
        report.rss_start = _anon_rss(proc)
        if http is not None:
            _fuzz_http(http, broker.addr, _broker_seeds(topic), profile["http-broker"] - warm, rng, seed)
        if "http-nameserver" in profile:
            ns = cluster.namesrv_addr.split(";")[0]
            _fuzz_http(report.targets["http-nameserver"], ns, _nameserver_seeds(broker.addr),
                       profile["http-nameserver"], rng, seed)
        file_size = 64 * 1024
        steps: list[tuple[str, list[bytes], Callable[[bytes], object], tuple[type[BaseException], ...]]] = [
            ("send-batch", [_seed_batch(topic)], decode_batch, (MessageIllegalError, ProtocolViolationError)),
            ("ha-frames", _ha_frame_seeds(file_size), _ha_frames_call(file_size), (HAProtocolError, RecordViolation)),
            ("ha-reports", [(12345).to_bytes(8, "big"), b"\x00" * 16], lambda d: ReportDecoder().feed(d),
             (HAProtocolError,)),
            ("properties", [b"brokerName=a\nlistenPort=0\nbrokerRole=SYNC_MASTER\n", b"a\\\n b=c\n#x\n!y\nk:v\n"],
             _properties_call, (PropertiesSyntaxError, ConfigError)),
        ]
        for name, seeds, call, allowed in steps:
            if name in profile:
                _fuzz_calls(report.targets[name], seeds, profile[name], rng, seed, call, allowed)
        report.rss_end = _anon_rss(proc)
        report.store_intact = _store_intact(cluster, topic, sent)
    return report


def run(quick: bool) -> list[Row]:
    """Runner entry (``python -m benchmarks fuzz``): the full profile (``--quick``: the short one)."""
    report = run_fuzz(SHORT if quick else FULL)
    for line in report.failures:
        print(f"FUZZ FAILURE {line}", flush=True)
    print(f"fuzz seed {report.seed}", flush=True)
    return report.rows()
