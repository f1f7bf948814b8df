"""``python -m benchmarks.chaos [--profile short|full] [--mode sync|async] [--seed N] [--disk MODE] [--root DIR]
[--plain]``:
one chaos run; prints its table and its failures, exits 1 when it found any."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from benchmarks import format_table
from benchmarks.chaos.profiles import PROFILES
from benchmarks.chaos.run import run_chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--profile", choices=sorted(PROFILES), default="short")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--seed", type=int, default=None, help="the nemesis's seed (random when omitted)")
    parser.add_argument("--disk", choices=["auto", "tmpfs", "fault-layer"], default="auto",
                        help="how disks are filled: tmpfs needs root; auto picks it when running as root")
    parser.add_argument("--root", type=Path, default=None, help="run directory (kept); a temporary one otherwise")
    parser.add_argument("--plain", action="store_true",
                        help="producers not idempotent (duplicates explained by their retries are allowed)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every fault")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    report = run_chaos(PROFILES[args.profile], mode=args.mode, seed=args.seed, disk=args.disk, root=args.root,
                       progress=lambda line: print(line, file=sys.stderr, flush=True), idempotent=not args.plain)
    print(format_table(f"chaos {args.profile} {args.mode}", report.rows()), flush=True)
    print(report.summary(), flush=True)
    return 1 if report.failures() else 0


if __name__ == "__main__":
    sys.exit(main())
