"""HA is part of the broker: without its package the broker does not start. The controller used to catch the
ImportError and start with inert stand-ins, so a SYNC_MASTER refused every send and a slave served stale reads
while logging one warning."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.config import BrokerConfig
from broker.controller import BrokerController
from broker.ha import HAClient, HAService
from common.codes import BrokerRole
from tests.broker.fakes import STORE_HOST, FakeStore
from tests.broker.procs import ROOT, ProcessExited, read_first_line, write_properties

#: ``broker.ha`` unimportable, as a broken install or a bad edit would leave it.
_BLOCK_HA = "import sys; sys.modules['broker.ha'] = None\n"
#: Runs ``python -m broker`` without ``broker.ha``.
_MAIN_WITHOUT_HA = _BLOCK_HA + ("import runpy; sys.argv[0] = 'broker'; "
                                "runpy.run_module('broker', run_name='__main__', alter_sys=True)")
#: Builds and starts a SYNC_MASTER controller over the fake store without ``broker.ha``; prints what it got.
_CONTROLLER_WITHOUT_HA = _BLOCK_HA + """
import asyncio
from broker.config import BrokerConfig
from broker.controller import BrokerController
from common.codes import BrokerRole
from tests.broker.fakes import STORE_HOST, FakeStore

async def main():
    cfg = BrokerConfig(store_path_root_dir=sys.argv[1], broker_role=BrokerRole.SYNC_MASTER, broker_name="b",
                       listen_port=0, ha_listen_port=0)
    ctrl = BrokerController(cfg, FakeStore(), addr="127.0.0.1:10911", store_host=STORE_HOST)
    await ctrl.start()
    print("started with", type(ctrl.ha_service).__name__, flush=True)
    await ctrl.stop()

asyncio.run(main())
"""


def test_controller_without_its_ha_package_raises_the_import_error(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-c", _CONTROLLER_WITHOUT_HA, str(tmp_path)], capture_output=True,
                       cwd=ROOT, timeout=60, check=False)
    out, err = r.stdout.decode(), r.stderr.decode(errors="replace")
    assert "started" not in out, f"the controller started without broker.ha: {out!r}"
    assert r.returncode != 0 and "ModuleNotFoundError" in err and "broker.ha" in err, err[-2000:]


def test_broker_without_its_ha_package_fails_at_start_with_the_error(tmp_path: Path) -> None:
    props = write_properties(tmp_path / "b.properties", {
        "listenPort": "0", "haListenPort": "0", "storePathRootDir": str(tmp_path / "store"),
        "mappedFileSizeCommitLog": str(1 << 20), "brokerRole": "SYNC_MASTER",
    })
    stderr_path = tmp_path / "broker.log"
    with stderr_path.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", _MAIN_WITHOUT_HA, "-c", str(props)], stdout=subprocess.PIPE,
                                stderr=err, cwd=ROOT)
    try:
        with pytest.raises(ProcessExited) as exited:
            line = read_first_line(proc, stderr_path)
            pytest.fail(f"the broker started without broker.ha: {line!r}")
        assert exited.value.rc != 0
        assert "broker.ha" in exited.value.stderr and "Error" in exited.value.stderr, exited.value.stderr[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        assert proc.stdout is not None
        proc.stdout.close()


@pytest.mark.parametrize("role", [BrokerRole.SYNC_MASTER, BrokerRole.SLAVE])
def test_controller_builds_the_real_ha_objects_when_none_are_given(tmp_path: Path, role: BrokerRole) -> None:
    cfg = BrokerConfig(store_path_root_dir=str(tmp_path), broker_role=role, broker_name="broker-a",
                       broker_id=1 if role is BrokerRole.SLAVE else 0, listen_port=0, ha_listen_port=0)
    store: Any = FakeStore(role)
    ctrl = BrokerController(cfg, store, addr="127.0.0.1:10911", store_host=STORE_HOST, http_client=object())
    assert isinstance(ctrl.ha_service, HAService)
    assert isinstance(ctrl.ha_client, HAClient) is (role is BrokerRole.SLAVE)
