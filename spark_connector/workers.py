"""Can Spark's Python workers import the connector? Checked once, on the driver, when it is registered.

Spark runs a Python data source's planning (``schema``, ``reader``, partitions) and its tasks in Python worker
processes it starts itself, with the interpreter ``PYSPARK_PYTHON`` names when the SparkContext is created
(``python3`` when unset). When that interpreter is not the one splitmq is installed in, every ``load()`` fails
deep inside Spark with ``ModuleNotFoundError: No module named 'spark_connector'`` (or ``'pyarrow'``), which says
nothing about what to do. :func:`missing_modules` asks that interpreter directly, so :func:`spark_connector.register`
can say it in one line. The check sees this host only: executors on other hosts need the same interpreter path
with splitmq installed (docs/SPARK.md).
"""

from __future__ import annotations

import os
import subprocess

__all__ = ["NEEDED_MODULES", "missing_modules", "worker_python_problem"]

#: What a Python worker imports to run the connector.
NEEDED_MODULES = ("spark_connector", "client", "pyarrow")

_PROBE = ("import importlib.util, sys\n"
          "print(','.join(m for m in sys.argv[1:] if importlib.util.find_spec(m) is None))")


def missing_modules(python_exec: str, *, timeout_s: float = 30.0) -> list[str] | None:
    """The modules of :data:`NEEDED_MODULES` that ``python_exec`` cannot find (with this process's environment,
    which Spark's JVM inherited), or None when the interpreter could not be run at all."""
    try:
        proc = subprocess.run([python_exec, "-c", _PROBE, *NEEDED_MODULES], capture_output=True, text=True,
                              timeout=timeout_s, env=dict(os.environ), check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return [m for m in proc.stdout.strip().split(",") if m]


def worker_python_problem(python_exec: str, python_here: str, *, shipped: bool) -> str | None:
    """A one-line explanation when Spark's workers cannot run the connector, else None.

    Args:
        python_exec: the interpreter Spark starts for its Python workers (``SparkContext.pythonExec``).
        python_here: this driver's interpreter (``sys.executable``), the one that has splitmq.
        shipped: packages are shipped to the workers (``spark.submit.pyFiles`` / ``spark.archives`` set), so a
            missing module on this host proves nothing.
    """
    if shipped:
        return None
    missing = missing_modules(python_exec)
    if missing is None:
        return (f"Spark's Python workers would run {python_exec!r} (PYSPARK_PYTHON), which cannot be started here: "
                f"set PYSPARK_PYTHON={python_here} before creating the SparkSession (see docs/SPARK.md)")
    if not missing:
        return None
    return (f"Spark's Python workers run {python_exec!r} (PYSPARK_PYTHON), which cannot import "
            f"{', '.join(missing)}: set PYSPARK_PYTHON={python_here} before creating the SparkSession, or install "
            "the repository's '.[spark]' into that interpreter on every executor host, or ship it with --py-files "
            "(see docs/SPARK.md)")
