"""The short profile of the fuzz suite (benchmarks/fuzz_bench.py; the full one is ``python -m benchmarks fuzz``):
every HTTP endpoint of a real broker and nameserver, the send-batch decoder, the HA frame and report decoders and
the .properties loader get seeded mutations of valid inputs; no 5xx, crash or hang, the broker's anonymous memory
flat, the store intact."""

from __future__ import annotations

import pytest

from benchmarks.fuzz_bench import SHORT, FuzzReport, mutate, run_fuzz

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_short_profile_finds_no_5xx_crash_or_hang() -> None:
    report = run_fuzz(SHORT)
    assert report.failures == [], f"seed {report.seed}: " + "\n".join(report.failures)
    assert sum(t.inputs for t in report.targets.values()) == sum(SHORT.values())
    assert report.targets["http-broker"].client_errors > 0  # the mutations do reach the error paths


def test_the_report_fails_on_each_kind_of_finding() -> None:
    from benchmarks.fuzz_bench import TargetResult

    for kind in ("5xx", "hang", "crash"):
        t = TargetResult()
        t.fail(kind, 1, b"x", "detail")
        assert FuzzReport({"t": t}, store_intact=True).failures
    assert FuzzReport({}, store_intact=False).failures
    assert FuzzReport({}, rss_start=0, rss_end=6 << 20, store_intact=True).failures
    assert FuzzReport({}, rss_start=0, rss_end=1 << 20, store_intact=True).failures == []


def test_mutate_is_seeded() -> None:
    import random

    a = [mutate(random.Random(7), b"seed input") for _ in range(3)]
    b = [mutate(random.Random(7), b"seed input") for _ in range(3)]
    assert a == b and any(x != b"seed input" for x in a)


def test_the_raw_client_reads_an_answer_body_and_keeps_the_connection() -> None:
    """The fuzzer judges 4xx answers by their bodies (a RocketMQ code): it must read them, and a HEAD answer's
    announced length must not be waited for."""
    import socket
    import threading

    from benchmarks.fuzz_bench import _RawHttp

    body = b'{"code": 13, "remark": "no"}'
    answers = [b"HTTP/1.1 403 Forbidden\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body),
               b"HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n"]
    with socket.create_server(("127.0.0.1", 0)) as server:
        accepted: list[int] = []

        def serve() -> None:
            conn, _ = server.accept()
            accepted.append(1)
            with conn:
                for answer in answers:
                    conn.recv(65536)
                    conn.sendall(answer)
                conn.recv(65536)

        worker = threading.Thread(target=serve)
        worker.start()
        client = _RawHttp(f"127.0.0.1:{server.getsockname()[1]}", timeout_s=5)
        assert client.request(b"GET / HTTP/1.1\r\n\r\n") == (403, body)
        assert client.request(b"HEAD / HTTP/1.1\r\n\r\n", head=True) == (200, b"")
        client.close()
        worker.join(5)
    assert accepted == [1]  # both answers on one connection: the first was read whole, so it was kept
