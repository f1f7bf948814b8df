"""``python -m benchmarks NAME [NAME ...] [--quick]``: run registered benchmarks and print their tables."""

from __future__ import annotations

import argparse
import logging
import sys

from benchmarks import ENTRIES, format_table, load_entry


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("names", nargs="+", help=f"entries to run: {', '.join(sorted(ENTRIES))} or all")
    parser.add_argument("--quick", action="store_true", help="small sizes (CI smoke)")
    args = parser.parse_args(argv)
    # Benchmarks crash stores on purpose; their recovery warnings are expected noise here.
    logging.basicConfig(level=logging.ERROR)
    names = sorted(ENTRIES) if "all" in args.names else args.names
    for name in names:
        try:
            fn = load_entry(name)
        except KeyError as exc:
            parser.error(str(exc.args[0]))
        print(format_table(name, fn(args.quick)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
