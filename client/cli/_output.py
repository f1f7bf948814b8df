"""How the ``splitmq`` tool writes: aligned text tables and ``key: value`` lists, or JSON with ``--json``.

Results go to stdout, diagnostics and progress to stderr, so ``splitmq ... --json | jq`` sees only the result.
Progress lines (a counter rewritten in place) are written only when stderr is a terminal: a log file or a
pipe gets the final count once, not a stream of carriage returns.
Every cell is printed without white space inside it (empty cells become ``-``), so a table row splits on
white space into exactly its columns.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

__all__ = ["Output", "cell", "fmt_body", "fmt_time_ms"]

#: Printed for a value nobody knows (an unreachable broker, a figure the broker does not record).
NA = "n/a"


def fmt_time_ms(ms: object) -> str:
    """A millisecond epoch timestamp as local ISO time to the millisecond; ``n/a`` for missing or zero."""
    if not isinstance(ms, int | float) or isinstance(ms, bool) or ms <= 0:
        return NA
    try:
        return datetime.datetime.fromtimestamp(ms / 1000).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def fmt_body(body: bytes, max_chars: int) -> str:
    """A message body for one line: UTF-8 with replacement, line breaks escaped, cut at ``max_chars``."""
    text = body.decode("utf-8", "replace").replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
    if max_chars > 0 and len(text) > max_chars:
        return text[:max_chars] + "..."
    return text


def cell(value: object) -> str:
    """One table cell: no white space inside, ``-`` for empty, ``yes``/``no`` for booleans."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    text = f"{value:.1f}" if isinstance(value, float) else str(value)
    text = "_".join(text.split())
    return text or "-"


class Output:
    """Writes results (tables, key/value lists, JSON) to ``out`` and diagnostics to ``err``.

    Args:
        out: where results go (stdout).
        err: where errors, warnings and progress go (stderr).
        json_mode: write results as JSON instead of text.
    """

    def __init__(self, out: TextIO, err: TextIO, *, json_mode: bool = False, tty: bool | None = None) -> None:
        self.out = out
        self.err = err
        self.json_mode = json_mode
        self.tty = _isatty(err) if tty is None else tty
        """Whether progress lines are drawn (stderr is a terminal, unless the caller says otherwise)."""
        self._progress_shown = False

    def line(self, text: str = "") -> None:
        """One line of result text, flushed (a pipe reader sees it at once)."""
        self.out.write(text + "\n")
        self.out.flush()

    def error(self, text: str) -> None:
        """One diagnostic line on stderr, prefixed ``splitmq: error:``."""
        self.err.write(f"splitmq: error: {text}\n")
        self.err.flush()

    def warn(self, text: str) -> None:
        self.err.write(f"splitmq: warning: {text}\n")
        self.err.flush()

    def info(self, text: str) -> None:
        """A status line on stderr (kept out of the result stream)."""
        self.err.write(text + "\n")
        self.err.flush()

    def progress(self, text: str) -> None:
        """Rewrite the current stderr line in place (a counter) on a terminal; nothing elsewhere.
        ``end_progress`` finishes the line."""
        if not self.tty:
            return
        self.err.write("\r" + text + "\x1b[K")  # erase what a longer previous line left
        self.err.flush()
        self._progress_shown = True

    def end_progress(self) -> None:
        """Finish a progress line, if one was drawn, so the next line starts clean."""
        if self._progress_shown:
            self.err.write("\r\x1b[K")
            self.err.flush()
            self._progress_shown = False

    def json(self, obj: Any, *, compact: bool = False) -> None:
        """``obj`` as JSON (one line when ``compact``: JSON Lines for streams)."""
        if compact:
            self.line(json.dumps(obj, separators=(",", ":"), sort_keys=True, default=str))
        else:
            self.line(json.dumps(obj, indent=2, sort_keys=True, default=str))

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[object]], *, title: str | None = None) -> None:
        """An aligned text table (``title`` above it when given; ``(none)`` for no rows)."""
        if title:
            self.line(title)
        cells = [[cell(v) for v in row] for row in rows]
        widths = [len(h) for h in headers]
        for row in cells:
            for i, c in enumerate(row):
                widths[i] = max(widths[i], len(c))
        self.line(_join(headers, widths))
        for row in cells:
            self.line(_join(row, widths))
        if not rows:
            self.line("(none)")

    def kv(self, pairs: Mapping[str, object] | Sequence[tuple[str, object]], *, title: str | None = None) -> None:
        """A ``key: value`` list with aligned values."""
        items = list(pairs.items()) if isinstance(pairs, Mapping) else list(pairs)
        if title:
            self.line(title)
        width = max((len(k) for k, _ in items), default=0)
        for k, v in items:
            self.line(f"{k + ':':<{width + 1}} {v if isinstance(v, str) else cell(v)}")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or unusual stream draws nothing
        return False


def _join(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(f"{v:<{w}}" for v, w in zip(values, widths, strict=True)).rstrip()
