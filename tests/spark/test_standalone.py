"""The connector on a real Spark standalone cluster (issue 16 item 3): a master and a worker started from the
pyspark installation, an application submitted to ``spark://`` that reads (batch, and streaming restarted from
its checkpoint) and writes, with its tasks run by the worker's executor, not in the driver."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Admin, Message, Producer
from client.cluster import LocalCluster

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def _spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class _Daemon:
    """A Spark master or worker JVM (``spark-class``), its log read until a line says it is up."""

    def __init__(self, name: str, args: list[str], log_dir: Path) -> None:
        self.log = log_dir / f"{name}.log"
        env = dict(os.environ, SPARK_HOME=str(_spark_home()), SPARK_LOCAL_IP="127.0.0.1",
                   SPARK_DAEMON_MEMORY="256m", SPARK_LOG_DIR=str(log_dir))
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen([str(_spark_home() / "bin" / "spark-class"), *args], stdout=out,
                                         stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_for(self, pattern: str, timeout_s: float = 90.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            m = re.search(pattern, self.log.read_text(errors="replace"))
            if m:
                return m
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)  # polling a log file with a deadline
        raise AssertionError(f"{self.log.name}: no {pattern!r} within {timeout_s} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``(spark://HOST:PORT, worker work dir)`` of a one-worker standalone cluster on loopback, ports chosen by
    the JVMs (0) and read from their logs."""
    base = tmp_path_factory.mktemp("standalone")
    conf = base / "spark-defaults.conf"
    conf.write_text("spark.master.rest.enabled false\n")
    daemons: list[_Daemon] = []
    try:
        master = _Daemon("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "0",
                                    "--webui-port", "0", "--properties-file", str(conf)], base)
        daemons.append(master)
        url = master.wait_for(r"Starting Spark master at (spark://[0-9.]+:\d+)").group(1)
        work = base / "work"
        worker = _Daemon("worker", ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
                                    "--port", "0", "--webui-port", "0", "--cores", "2", "--memory", "1g",
                                    "--work-dir", str(work), "--properties-file", str(conf)], base)
        daemons.append(worker)
        worker.wait_for(r"Successfully registered with master")
        yield url, work
    finally:
        for d in reversed(daemons):
            d.stop()


def test_batch_streaming_restart_and_write_on_a_standalone_cluster(
        standalone: tuple[str, Path], tmp_path: Path) -> None:
    url, work = standalone
    with LocalCluster(tmp_path / "mq", broker_groups=1, slaves_per_group=1) as cluster:
        ns = cluster.namesrv_addr
        with Admin(ns) as admin:
            admin.create_topic("StandaloneIn", queue_nums=2)
            admin.create_topic("StandaloneOut", queue_nums=2)
        with Producer("standalone-test", ns) as producer:
            producer.send_batch([Message("StandaloneIn", f"m{i}".encode()) for i in range(20)])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
        env.pop("PYSPARK_PYTHON", None)  # the application sets it itself, as docs/SPARK.md says
        proc = subprocess.run([sys.executable, str(HERE / "standalone_app.py"), url, ns, str(tmp_path / "app")],
                              capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"app failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    first = sorted(f"m{i}" for i in range(20))
    assert result["batch"] == first
    assert result["stream_first"] == first
    assert result["stream_restart"] == sorted(f"m{i}" for i in range(100, 110))  # only what came after
    assert result["written"] == sorted(f"w{i}" for i in range(30))
    assert result["executors"] == url
    apps = list(work.glob("app-*/*/stderr"))
    assert apps, "no executor ran on the standalone worker"


def test_register_names_the_fix_when_the_workers_python_lacks_the_connector(tmp_path: Path) -> None:
    """What a user without PYSPARK_PYTHON gets on a cluster: one line saying what to set, at ``register``,
    instead of a ``ModuleNotFoundError`` from inside Spark at the first ``load()``."""
    bare = tmp_path / "bare-python"
    bare.write_text("#!/bin/sh\nexec " + str(Path(sys.base_prefix) / "bin" / "python3") + ' -I "$@"\n')
    bare.chmod(0o755)
    env = dict(os.environ, SPLITMQ_TEST_WORKER_PYTHON=str(bare))
    env.pop("PYTHONPATH", None)
    proc = subprocess.run([sys.executable, str(HERE / "standalone_app.py"), "local[1]", "127.0.0.1:1",
                           str(tmp_path / "app")], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path, check=False)
    refused = [ln for ln in proc.stdout.splitlines() if ln.startswith("REFUSED ")]
    assert proc.returncode == 3 and refused, f"{proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    assert f"PYSPARK_PYTHON={sys.executable}" in refused[0] and "cannot import spark_connector" in refused[0]
