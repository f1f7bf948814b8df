"""``python -m benchmarks peers``: the rounds and ratios (no servers), the skip of a peer that is not installed
(SplitMQ rows only, with the install hint), and, where Redis and NATS are installed, a tiny end-to-end run.

The peers are benchmark peers, not product dependencies: a machine without them skips the last test and says why.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import __main__ as bench_main
from benchmarks import _peer_servers, peers_bench
from benchmarks.peers_bench import Profile, _contest, _pair_row, _rows, _Side

#: Each side runs once, for a moment: the tests check the plumbing, not the figures.
TINY = Profile(rounds=1, send_s=0.05, read_messages=256, read_s=0.01)


def _fixed(label: str, rate: float, order: list[str], target: str = "") -> _Side:
    def run() -> tuple[int, float]:
        order.append(label)
        return int(rate), 1.0

    return _Side(label, run, target)


def test_sides_take_turns_in_a_rotating_order_and_rows_give_medians_and_ratios() -> None:
    order: list[str] = []
    sides = [_fixed("ours", 300, order), _fixed("redis", 100, order, ">= 1.5x"), _fixed("nats", 600, order)]
    result = _contest("batch", sides, rounds=3)
    assert order == ["ours", "redis", "nats", "redis", "nats", "ours", "nats", "ours", "redis"]
    rows = _rows(result)
    assert [(r.baseline_name, r.baseline, r.ratio, r.target) for r in rows[0::2]] == [
        ("redis", 100.0, 3.0, ">= 1.5x"), ("nats", 600.0, 0.5, "")]
    assert rows[1].name == "  ratio per round: 3.00 3.00 3.00 (median)" and rows[1].value == 3.0
    assert rows[3].baseline_name == "vs nats" and rows[3].value == 0.5


def test_a_pair_row_sets_two_other_sides_against_each_other_round_by_round() -> None:
    sides = [_fixed("ours", 300, []), _fixed("raw", 400, []), _fixed("redis", 200, [])]
    result = _contest("single send", sides, rounds=2)
    result.rates["raw"][1] = None  # a round a side did not run is left out
    [row] = _pair_row(result, "raw", "redis")
    assert row.name == "  raw / redis, per round: 2.00 (median)" and row.value == 2.0 and row.unit == "x"
    assert _pair_row(result, "raw", "nats") == []  # a side that is not in the contest: no row
    result.rates["raw"][0] = None
    assert _pair_row(result, "raw", "redis") == []  # no round where both ran: no row


def test_without_peers_a_workload_has_the_splitmq_row_alone() -> None:
    rows = _rows(_contest("single send", [_fixed("ours", 50, [])], rounds=2))
    assert [(r.name, r.value, r.baseline_name) for r in rows] == [("single send: ours", 50.0, "")]


def test_a_missing_peer_is_named_with_the_command_that_installs_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_peer_servers, "find_binary", lambda name: None)
    skipped = peers_bench.skipped_peers()
    assert set(skipped) == {"Redis Streams", "NATS JetStream"}
    # The servers are missing (patched); the Python clients may be too (they are the [bench] extra, not dev).
    assert skipped["Redis Streams"].startswith("redis-server") and " not installed; " in skipped["Redis Streams"]
    assert "apt-get install redis-server" in skipped["Redis Streams"]
    assert "apt-get install nats-server" in skipped["NATS JetStream"]
    assert all("pip install 'splitmq[bench]'" in why for why in skipped.values())


@pytest.mark.integration
def test_peers_not_installed_prints_the_hint_and_splitmq_rows_only(monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_peer_servers, "find_binary", lambda name: None)
    monkeypatch.setattr(peers_bench, "QUICK", TINY)
    assert bench_main.main(["peers", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "peers: Redis Streams skipped: redis-server" in out and "install with: apt-get install redis-server" in out
    assert "peers: NATS JetStream skipped: nats-server" in out and "install with: apt-get install nats-server" in out
    assert "with slave read settings, SplitMQ's slave answered up to 256 messages per pull" in out
    # A slave's own defaults (1024 messages / 4 MiB per answer) let the whole pull through, as the tuned row does;
    # RocketMQ's 32 are a master's cap.
    assert "with broker defaults, SplitMQ's slave answered up to 256 messages per pull" in out
    table = out[out.index("== peers =="):].splitlines()[3:]
    assert [line.split(":")[0] for line in table] == [
        "single send", "  ratio per round", "single send", "  ratio per round", "batch of 64", "  ratio per round",
        "single send, replicated", "  ratio per round", "batch of 64, replicated", "  ratio per round",
        "read the slave, 1000 per pull, slave read settings", "read the slave, 1000 per pull, broker defaults"]
    # Neither the raw POSTs to the master nor the floor needs a peer.
    assert "raw 1-msg POST, SplitMQ ASYNC_MASTER (no SDK work)" in table[0]
    assert "raw 1-msg POST, null HTTP server (loopback floor)" in table[2]
    assert "raw 64-msg POST, SplitMQ ASYNC_MASTER (no SDK work)" in table[4]
    assert "raw 1-msg POST, SplitMQ SYNC_MASTER (no SDK work)" in table[6]
    assert "raw 64-msg POST, SplitMQ SYNC_MASTER (no SDK work)" in table[8]
    assert not any("Redis" in line or "NATS" in line for line in table)


@pytest.mark.integration
@pytest.mark.slow
def test_every_peer_side_by_side_when_installed() -> None:
    if (missing := peers_bench.skipped_peers()):
        pytest.skip(f"benchmark peers not installed here: {missing}")
    rows = peers_bench.measure(TINY)
    baselines = [r.baseline_name for r in rows if r.baseline]
    assert baselines == [
        "Redis XADD", "NATS publish, R1", "raw 1-msg POST, SplitMQ ASYNC_MASTER (no SDK work)",
        "raw 1-msg POST, null HTTP server (loopback floor)",
        "Redis pipeline 64 XADD", "NATS 64 publishes gathered, R1", "raw 64-msg POST, SplitMQ ASYNC_MASTER (no SDK work)",
        "Redis XADD + WAIT 1", "NATS publish, R3", "raw 1-msg POST, SplitMQ SYNC_MASTER (no SDK work)",
        "Redis pipeline 64 XADD + WAIT 1", "NATS 64 publishes gathered, R3",
        "raw 64-msg POST, SplitMQ SYNC_MASTER (no SDK work)",
        "Redis XREAD COUNT 1000, replica", "NATS fetch(1000), R1", "NATS fetch(1000), R3",
        "Redis XREAD COUNT 1000, replica",
    ]
    assert all(r.value > 0 for r in rows)
    # Under each send contest, the broker fed raw POSTs against Redis.
    pairs = [r.name.split(", per round")[0].strip() for r in rows if "/ Redis" in r.name]
    assert pairs == ["raw 1-msg POST, SplitMQ ASYNC_MASTER (no SDK work) / Redis XADD",
                     "raw 64-msg POST, SplitMQ ASYNC_MASTER (no SDK work) / Redis pipeline 64 XADD",
                     "raw 1-msg POST, SplitMQ SYNC_MASTER (no SDK work) / Redis XADD + WAIT 1",
                     "raw 64-msg POST, SplitMQ SYNC_MASTER (no SDK work) / Redis pipeline 64 XADD + WAIT 1"]


def test_the_read_row_uses_the_slave_settings_the_docs_recommend() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    spark, bench = (docs / "SPARK.md").read_text(), (docs / "BENCHMARKS.md").read_text()
    for key, value in peers_bench.SLAVE_READ_SETTINGS.items():
        assert f"`{key}={value}`" in bench, key
        assert key == "slaveReadEnable" or f"\n{key}={value}\n" in spark, key


def test_a_peer_that_fails_is_left_out_of_its_later_rounds_and_the_table_still_prints(
        capsys: pytest.CaptureFixture[str]) -> None:
    order: list[str] = []
    runs = {"nats": 0}

    def nats_dies_in_round_two() -> tuple[int, float]:
        order.append("nats")
        runs["nats"] += 1
        if runs["nats"] == 2:
            raise RuntimeError("stream not found")
        return 100, 1.0

    sides = [_fixed("ours", 300, order), _Side("nats", nats_dies_in_round_two, "> 1.0x"),
             _fixed("redis", 150, order)]
    result = _contest("single send", sides, rounds=3)
    assert order == ["ours", "nats", "redis", "nats", "redis", "ours", "redis", "ours"]  # round 3 without nats
    assert result.rates["nats"] == [100.0, None, None]
    rows = _rows(result)
    assert [(r.baseline_name, r.baseline, r.ratio) for r in rows[0::2]] == [("nats", 100.0, 3.0),
                                                                            ("redis", 150.0, 2.0)]
    assert rows[1].name == "  ratio per round: 3.00 - - (median)"
    assert "nats failed in round 2 of 'single send' (RuntimeError: stream not found)" in capsys.readouterr().out


def test_a_peer_that_fails_every_round_gets_a_row_that_says_so() -> None:
    def broken() -> tuple[int, float]:
        raise ConnectionError("refused")

    rows = _rows(_contest("batch", [_fixed("ours", 300, []), _Side("nats", broken)], rounds=2))
    assert [(r.name, r.value, r.baseline_name) for r in rows] == [
        ("batch: ours", 300.0, "nats: failed in every round (see the notes)")]


def test_splitmq_failing_ends_the_run() -> None:
    def broken() -> tuple[int, float]:
        raise RuntimeError("broker gone")

    with pytest.raises(RuntimeError, match="broker gone"):
        _contest("batch", [_Side("ours", broken), _fixed("redis", 100, [])], rounds=1)
