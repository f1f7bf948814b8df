"""Java ``.properties`` text -> ``{key: value}``, the way ``java.util.Properties.load`` reads it.

Rules kept: ``key=value``, ``key = value``, ``key:value`` and ``key value``; comment lines start with ``#`` or
``!``; a line ending in an odd number of backslashes continues on the next line (leading white space of the
continuation dropped); escapes ``\\t \\n \\r \\f \\uXXXX`` and ``\\<char>``. One deliberate difference: values
are trimmed at both ends (Java keeps trailing white space, which silently breaks ``slaveReadEnable=true ``).
"""

from __future__ import annotations

__all__ = ["PropertiesSyntaxError", "parse_properties"]

_WS = " \t\f"
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


class PropertiesSyntaxError(ValueError):
    """The text cannot be read as a properties file (bad ``\\u`` escape); the message names the line."""


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """Join continuation lines; returns ``(first physical line number, logical line)``."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.lstrip(_WS)
        if not pending:
            if not line or line[0] in "#!":
                continue
            start = number
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append((start, "".join(pending)))
        pending = []
    if pending:
        out.append((start, "".join(pending)))
    return out


def _unescape(s: str, line_no: int) -> str:
    if "\\" not in s:
        return s
    out: list[str] = []
    i, n = 0, len(s)
    while i < n:
        c = s[i]
        if c != "\\" or i + 1 >= n:
            out.append(c)
            i += 1
            continue
        nxt = s[i + 1]
        if nxt == "u":
            digits = s[i + 2 : i + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise PropertiesSyntaxError(f"line {line_no}: malformed \\uXXXX escape {s[i : i + 6]!r}")
            out.append(chr(int(digits, 16)))
            i += 6
            continue
        out.append(_ESCAPES.get(nxt, nxt))
        i += 2
    return "".join(out)


def _split_key(line: str) -> tuple[str, str]:
    """Split at the first unescaped ``=``, ``:`` or white space (then skip one separator)."""
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" or c in _WS:
            break
        i += 1
    key = line[:i]
    rest = line[i:].lstrip(_WS)
    if rest[:1] in ("=", ":"):
        rest = rest[1:]
    return key, rest


def parse_properties(text: str) -> dict[str, str]:
    """Parse properties text; later keys override earlier ones.

    Args:
        text: the file content.

    Returns:
        ``{key: value}`` with escapes resolved and values trimmed.

    Raises:
        PropertiesSyntaxError: a malformed ``\\uXXXX`` escape (the message names the line).
    """
    props: dict[str, str] = {}
    for line_no, line in _logical_lines(text):
        key, value = _split_key(line)
        key = _unescape(key, line_no)
        if not key:
            continue
        props[key] = _unescape(value, line_no).strip()
    return props
