"""spark_connector.register names the fix when Spark's Python workers cannot import the connector."""

from __future__ import annotations

import sys
from pathlib import Path

from spark_connector.workers import NEEDED_MODULES, missing_modules, worker_python_problem


def test_this_interpreter_has_everything() -> None:
    assert missing_modules(sys.executable) == []
    assert worker_python_problem(sys.executable, sys.executable, shipped=False) is None


def test_an_interpreter_without_the_packages_gets_a_message_saying_what_to_set(tmp_path: Path) -> None:
    # A bare interpreter: -I-like isolation by an empty PYTHONPATH is not enough (the venv's site-packages come
    # with sys.executable), so use the base interpreter the venv was made from when it differs, else a fake one.
    base = Path(sys.base_prefix) / "bin" / "python3"
    if base.exists() and missing_modules(str(base)):
        problem = worker_python_problem(str(base), sys.executable, shipped=False)
        assert problem is not None
        assert f"PYSPARK_PYTHON={sys.executable}" in problem and "cannot import" in problem
        assert "pyarrow" in problem or "spark_connector" in problem
    fake = tmp_path / "python-that-lacks-everything"
    fake.write_text("#!/bin/sh\nfor m in " + " ".join(NEEDED_MODULES) + "; do :; done\n"
                    "echo spark_connector,pyarrow\n")
    fake.chmod(0o755)
    assert missing_modules(str(fake)) == ["spark_connector", "pyarrow"]
    problem = worker_python_problem(str(fake), sys.executable, shipped=False)
    assert problem is not None and "cannot import spark_connector, pyarrow" in problem
    assert worker_python_problem(str(fake), sys.executable, shipped=True) is None  # --py-files: can't tell here


def test_an_interpreter_that_does_not_run_is_named(tmp_path: Path) -> None:
    problem = worker_python_problem(str(tmp_path / "no-such-python"), sys.executable, shipped=False)
    assert problem is not None and "cannot be started here" in problem and "PYSPARK_PYTHON=" in problem
