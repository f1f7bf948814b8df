"""SQL92 property filters: RocketMQ's ``SelectorParser`` grammar, parsed by hand into closures (never ``eval``).

Shared by the SDK (``MessageSelector.sql`` refuses a bad expression before anything is sent) and the broker
(which evaluates the compiled filter against each candidate message's properties before returning it).

Grammar (RocketMQ's ``SelectorParser.jj``; loosest first, every binary level left-associative)::

    or         := and ( OR and )*
    and        := equality ( AND equality )*
    equality   := comparison ( ('=' | '<>') comparison | IS [NOT] NULL | IS [NOT] (TRUE | FALSE) )*
    comparison := unary ( ('>' | '>=' | '<' | '<=') unary
                        | [NOT] BETWEEN unary AND unary
                        | [NOT] IN '(' string (',' string)* ')'
                        | [NOT] (CONTAINS | STARTSWITH | ENDSWITH) string )*
    unary      := '+' unary | '-' unary | NOT unary | primary
    primary    := literal | identifier | '(' or ')'
    literal    := 'string' ('' escapes a quote) | integer [L] | decimal | TRUE | FALSE | NULL

Keywords are case-insensitive; identifiers (``[A-Za-z_$][A-Za-z0-9_$]*``) name message properties, user and
system alike (``TAGS``, ``KEYS``), case-sensitively. ``--`` and ``/* */`` comments are skipped. As in RocketMQ,
``NOT`` binds tighter than a comparison: write ``NOT (a = 1)``. ``IS [NOT] TRUE/FALSE`` is SplitMQ's addition
(``x IS TRUE`` is ``x = TRUE`` with an unknown answered FALSE, so it is never unknown).

Values follow Java's types, because RocketMQ's answers depend on them: integer literals are ``Integer`` when they
fit 32 bits and ``Long`` otherwise, decimals are ``Double``, properties are strings. Evaluation rules
(``ComparisonExpression``, ``LogicExpression``, ``UnaryExpression``):

* a missing property is NULL; a comparison with NULL is unknown, and an unknown filter does not match;
  ``a = b`` with both missing is TRUE (RocketMQ's equality), ``IS NULL`` is that test;
* a string compared with a number is converted to the number's type (``Integer.valueOf``, ``Long.valueOf``,
  ``Double.valueOf``): ``amount > 100`` reads ``'150'`` as 150, but ``'150.5'`` fails ``Integer.valueOf``;
  a string compared with a boolean is ``Boolean.valueOf`` (``'true'`` in any case, anything else false);
* ``<``, ``<=``, ``>``, ``>=`` between two strings (two properties) compare them as doubles;
* a conversion that fails aborts the evaluation (RocketMQ throws and logs), so the message does not match, even
  under NOT or OR -- unless an earlier operand already decided (AND and OR stop at the first deciding operand);
* ``IN``, ``CONTAINS``, ``STARTSWITH``, ``ENDSWITH`` take string literals; a missing property is unknown for IN,
  false for the others.

Refused when parsing, as RocketMQ refuses them: a string or boolean operand of ``<``/``>`` (``a > 'x'``), ``= NULL``,
``TRUE = 5``, ``BETWEEN`` with constant bounds in the wrong order or NULL, ``IN`` on anything but a property, a
number where a boolean is needed (``a AND 5``, ``NOT 5``), a decimal literal below ``Double.MIN_VALUE``
(``0.0``; write ``0``). Also refused (bounds): more than :data:`MAX_SQL_LENGTH` characters or nesting deeper
than :data:`MAX_SQL_DEPTH`.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping

__all__ = ["MAX_SQL_DEPTH", "MAX_SQL_LENGTH", "SqlFilter", "SqlFilterError", "compile_sql"]

#: Longest expression accepted (a bound on parse time and on the work each message costs).
MAX_SQL_LENGTH = 4096
#: Deepest nesting accepted (parentheses, unary operators, chained comparisons): a bound on recursion.
MAX_SQL_DEPTH = 40


class SqlFilterError(ValueError):
    """The expression is not valid SQL92 for a property filter; the message names the problem and where."""


class _Mismatch(Exception):
    """A conversion failed while evaluating (RocketMQ throws): the message does not match."""


class _Long(int):
    """A Java ``Long`` (an integer literal beyond 32 bits); plain ``int`` is a Java ``Integer``."""

    __slots__ = ()


Value = object  # None | bool | int | _Long | float | str
Props = Mapping[str, str]
Eval = Callable[[Props], Value]

# --- tokens -------------------------------------------------------------------------------------------------

_KEYWORDS = frozenset({"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
                       "STARTSWITH", "ENDSWITH"})
_SPACE = frozenset(" \t\n\r\f")
_DECIMAL = re.compile(r"0|[1-9][0-9]*[lL]?")
_FLOAT = re.compile(r"(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+)")
_IDENT = re.compile(r"[A-Za-z_$][A-Za-z0-9_$]*")
_STRING = re.compile(r"'(?:''|[^'])*'")
_OPERATORS = ("<>", "<=", ">=", "=", "<", ">", "(", ")", ",", "+", "-")
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_JAVA_DOUBLE = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_DOUBLE_MIN = 5e-324  # Java's Double.MIN_VALUE


class _Tok:
    __slots__ = ("kind", "pos", "text")

    def __init__(self, kind: str, text: str, pos: int) -> None:
        self.kind = kind  # "kw" (text upper-cased), "id", "str" (decoded), "int", "float", "op", "eof"
        self.text = text
        self.pos = pos


def _tokenize(src: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c in _SPACE:
            i += 1
            continue
        if src.startswith("--", i):
            j = src.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if src.startswith("/*", i):
            j = src.find("*/", i + 2)
            if j < 0:
                raise SqlFilterError(f"comment opened at {i} is never closed")
            i = j + 2
            continue
        if c == "'":
            m = _STRING.match(src, i)
            if m is None:
                raise SqlFilterError(f"string literal opened at {i} is never closed (a quote inside is written '')")
            toks.append(_Tok("str", m.group()[1:-1].replace("''", "'"), i))
            i = m.end()
            continue
        if c.isascii() and (c.isdigit() or c == "."):
            fm, dm = _FLOAT.match(src, i), _DECIMAL.match(src, i)
            fl, dl = (fm.end() if fm else i), (dm.end() if dm else i)
            if fl == dl == i:
                raise SqlFilterError(f"unexpected {c!r} at {i}")
            if fl > dl:
                toks.append(_Tok("float", src[i:fl], i))
                i = fl
            else:
                toks.append(_Tok("int", src[i:dl], i))
                i = dl
            continue
        m = _IDENT.match(src, i)
        if m is not None:
            word = m.group()
            up = word.upper()
            toks.append(_Tok("kw", up, i) if up in _KEYWORDS else _Tok("id", word, i))
            i = m.end()
            continue
        for op in _OPERATORS:
            if src.startswith(op, i):
                toks.append(_Tok("op", op, i))
                i += len(op)
                break
        else:
            raise SqlFilterError(f"unexpected character {c!r} at {i}")
    toks.append(_Tok("eof", "", n))
    return toks


# --- Java value semantics -----------------------------------------------------------------------------------


def _jclass(v: Value) -> str:
    if isinstance(v, bool):
        return "B"
    if isinstance(v, str):
        return "S"
    if isinstance(v, float):
        return "D"
    if isinstance(v, _Long):
        return "L"
    return "I"


def _java_int(s: str, bits: int) -> int:
    """``Integer.valueOf`` / ``Long.valueOf``: an ASCII decimal within range, else a mismatch."""
    if _JAVA_INT.fullmatch(s) is None:
        raise _Mismatch
    v = int(s)
    if not -(1 << (bits - 1)) <= v < 1 << (bits - 1):
        raise _Mismatch
    return v


def _java_double(s: str) -> float:
    """``Double.valueOf``: trims ASCII control and space, accepts NaN, Infinity and a d/f suffix (no hex)."""
    t = s.strip("".join(map(chr, range(33))))
    if _JAVA_DOUBLE.fullmatch(t) is None:
        raise _Mismatch
    if t[-1] in "fFdD" and not t.endswith("Infinity"):
        t = t[:-1]
    return float(t.replace("Infinity", "inf"))


def _java_bool(s: str) -> bool:
    return len(s) == 4 and s.lower() == "true"


def _cmp_double(a: float, b: float) -> int:
    """``Double.compareTo``: NaN above everything and equal to itself, -0.0 below 0.0."""
    if math.isnan(a) or math.isnan(b):
        return (math.isnan(a)) - (math.isnan(b))
    if a == b:
        return (math.copysign(1, a) > 0) - (math.copysign(1, b) > 0) if a == 0 else 0
    return -1 if a < b else 1


def _compare(lv: Value, rv: Value) -> int:
    """RocketMQ's ``ComparisonExpression.__compare`` with string conversion on."""
    lc, rc = _jclass(lv), _jclass(rv)
    if lc != rc:
        if lc == "B":
            if rc == "S":
                raise _Mismatch  # RocketMQ casts the Boolean to String here and throws
            return -1
        if lc in "IL":
            if rc == "D":
                lv = float(lv)  # type: ignore[arg-type]
            elif rc == "S":
                rv = _java_int(rv, 32 if lc == "I" else 64)  # type: ignore[arg-type]
            elif rc not in "IL":
                return -1
        elif lc == "D":
            if rc in "IL":
                rv = float(rv)  # type: ignore[arg-type]
            elif rc == "S":
                rv = _java_double(rv)  # type: ignore[arg-type]
            else:
                return -1
        else:  # a string against a boolean or a number
            if rc == "B":
                lv = _java_bool(lv)  # type: ignore[arg-type]
            elif rc == "I":
                lv = _java_int(lv, 32)  # type: ignore[arg-type]
            elif rc == "L":
                lv = _java_int(lv, 64)  # type: ignore[arg-type]
            else:
                lv = _java_double(lv)  # type: ignore[arg-type]
    if isinstance(lv, float) or isinstance(rv, float):
        return _cmp_double(float(lv), float(rv))  # type: ignore[arg-type]
    return (lv > rv) - (lv < rv)  # type: ignore[operator]


# --- nodes --------------------------------------------------------------------------------------------------

# What a node is decides what RocketMQ's parser lets it be used for.
_CONST, _BOOL_CONST, _PROP, _BOOL, _VALUE = "const", "bool-const", "prop", "bool", "value"


class _Node:
    __slots__ = ("depth", "ev", "kind", "text", "value")

    def __init__(self, kind: str, ev: Eval, depth: int, text: str, value: Value = None) -> None:
        self.kind = kind
        self.ev = ev
        self.depth = depth
        self.text = text
        self.value = value


def _const(kind: str, value: Value, text: str) -> _Node:
    return _Node(kind, lambda _p: value, 1, text, value)


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks = _tokenize(src)
        self.i = 0
        self.nesting = 0

    # -- token helpers --
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def at(self, kind: str, text: str) -> bool:
        t = self.toks[self.i]
        return t.kind == kind and t.text == text

    def at_kw2(self, first: str, second: str) -> bool:
        nxt = self.toks[min(self.i + 1, len(self.toks) - 1)]
        return self.at("kw", first) and nxt.kind == "kw" and nxt.text == second

    def take(self, kind: str, text: str, what: str) -> _Tok:
        t = self.tok
        if t.kind != kind or t.text != text:
            raise SqlFilterError(f"expected {what} at {t.pos}, found {_describe(t)}")
        self.i += 1
        return t

    def node(self, kind: str, ev: Eval, text: str, *children: _Node) -> _Node:
        depth = 1 + max((c.depth for c in children), default=0)
        if depth > MAX_SQL_DEPTH:
            raise SqlFilterError(f"expression nests deeper than MAX_SQL_DEPTH={MAX_SQL_DEPTH} levels")
        return _Node(kind, ev, depth, text)

    def enter(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_SQL_DEPTH:
            raise SqlFilterError(f"expression nests deeper than MAX_SQL_DEPTH={MAX_SQL_DEPTH} levels "
                                 f"(at {self.tok.pos})")

    # -- grammar --
    def parse(self) -> _Node:
        n = self.or_expr()
        if self.tok.kind != "eof":
            raise SqlFilterError(f"unexpected {_describe(self.tok)} at {self.tok.pos}")
        return _as_bool(n)

    def or_expr(self) -> _Node:
        return self._logic("OR", self.and_expr)

    def and_expr(self) -> _Node:
        return self._logic("AND", self.equality)

    def _logic(self, word: str, operand: Callable[[], _Node]) -> _Node:
        first = operand()
        if not self.at("kw", word):
            return first
        parts = [_as_bool(first)]
        while self.at("kw", word):
            self.i += 1
            parts.append(_as_bool(operand()))
        evs = tuple(p.ev for p in parts)
        text = f" {word} ".join(p.text for p in parts)
        # n-ary, folded left to right exactly as RocketMQ's left-deep binary nodes evaluate.
        return self.node(_BOOL, _or_eval(evs) if word == "OR" else _and_eval(evs), f"({text})", *parts)

    def equality(self) -> _Node:
        left = self.comparison()
        while True:
            if self.at("op", "=") or self.at("op", "<>"):
                op = self.tok.text
                self.i += 1
                right = self.comparison()
                left = _equal(self, left, right, negate=op == "<>")
            elif self.at("kw", "IS"):
                self.i += 1
                negate = self.at("kw", "NOT")
                if negate:
                    self.i += 1
                t = self.tok
                if t.kind != "kw" or t.text not in ("NULL", "TRUE", "FALSE"):
                    raise SqlFilterError(f"expected NULL, TRUE or FALSE after IS at {t.pos}, found {_describe(t)}")
                self.i += 1
                left = _is(self, left, t.text, negate)
            else:
                return left

    def comparison(self) -> _Node:
        left = self.unary()
        while True:
            t = self.tok
            if t.kind == "op" and t.text in _ORDER:
                self.i += 1
                left = _order(self, t.text, left, self.unary())
                continue
            negate = self.at("kw", "NOT") and self.toks[self.i + 1].kind == "kw" and \
                self.toks[self.i + 1].text in ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH")
            if negate:
                self.i += 1
                t = self.tok
            if t.kind != "kw" or t.text not in ("BETWEEN", "IN", "CONTAINS", "STARTSWITH", "ENDSWITH"):
                return left
            self.i += 1
            if t.text == "BETWEEN":
                low = self.unary()
                self.take("kw", "AND", "AND of BETWEEN")
                high = self.unary()
                left = _between(self, left, low, high, negate)
            elif t.text == "IN":
                left = _in(self, left, self._string_list(), negate)
            else:
                left = _text_match(self, t.text, left, self._string("after " + t.text), negate)

    def _string(self, where: str) -> str:
        t = self.tok
        if t.kind != "str":
            raise SqlFilterError(f"expected a 'string' literal {where} at {t.pos}, found {_describe(t)}")
        self.i += 1
        return t.text

    def _string_list(self) -> list[str]:
        self.take("op", "(", "( after IN")
        items = [self._string("in the IN list")]
        while self.at("op", ","):
            self.i += 1
            items.append(self._string("in the IN list"))
        self.take("op", ")", ") closing the IN list")
        return items

    def unary(self) -> _Node:
        t = self.tok
        if (t.kind == "op" and t.text in "+-") or (t.kind == "kw" and t.text == "NOT"):
            self.i += 1
            self.enter()
            operand = self.unary()
            self.nesting -= 1
            if t.text == "+":
                return operand
            if t.text == "-":
                return self.node(_VALUE, _negate_eval(operand.ev), f"-{operand.text}", operand)
            b = _as_bool(operand)
            return self.node(_BOOL, _not_eval(b.ev), f"NOT {b.text}", b)
        return self.primary()

    def primary(self) -> _Node:
        t = self.tok
        self.i += 1
        if t.kind == "str":
            return _const(_CONST, t.text, _quote(t.text))
        if t.kind == "int":
            return _const(_CONST, _int_literal(t), t.text)
        if t.kind == "float":
            return _const(_CONST, _float_literal(t), t.text)
        if t.kind == "kw" and t.text in ("TRUE", "FALSE", "NULL"):
            return _const(_BOOL_CONST, {"TRUE": True, "FALSE": False, "NULL": None}[t.text], t.text)
        if t.kind == "id":
            name = t.text
            return _Node(_PROP, lambda p: p.get(name), 1, name)
        if t.kind == "op" and t.text == "(":
            self.enter()
            inner = self.or_expr()
            self.nesting -= 1
            self.take("op", ")", "')'")
            return inner
        self.i -= 1
        raise SqlFilterError(f"expected a value, a property or '(' at {t.pos}, found {_describe(t)}")


def _describe(t: _Tok) -> str:
    if t.kind == "eof":
        return "the end of the expression"
    if t.kind == "str":
        return f"string {_quote(t.text)[:40]}"
    return repr(t.text[:40])


def _quote(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _int_literal(t: _Tok) -> int:
    text = t.text.rstrip("lL")
    v = int(text)
    if v >= 1 << 63:
        raise SqlFilterError(f"integer {t.text[:40]} at {t.pos} does not fit a 64-bit long")
    return v if v < 1 << 31 else _Long(v)


def _float_literal(t: _Tok) -> float:
    v = float(t.text)  # inf when too large, as Java's Double
    if v > 1.7976931348623157e308:
        raise SqlFilterError(f"decimal {t.text[:40]} at {t.pos} is larger than a double")
    if v < _DOUBLE_MIN:
        raise SqlFilterError(f"decimal {t.text[:40]} at {t.pos} is below Double.MIN_VALUE (RocketMQ refuses 0.0 "
                             f"and tiny decimals: write 0)")
    return v


def _as_bool(n: _Node) -> _Node:
    """RocketMQ's ``asBooleanExpression``: a property is cast (a string is FALSE), a number or string refused."""
    if n.kind in (_BOOL, _BOOL_CONST):
        return n
    if n.kind == _PROP:
        ev = n.ev

        def cast(p: Props) -> Value:
            v = ev(p)
            return v if v is None or isinstance(v, bool) else False

        return _Node(_BOOL, cast, n.depth + 1, n.text)
    raise SqlFilterError(f"{n.text[:60]} is not a boolean: expected a comparison, TRUE/FALSE or a property here")


# --- operators ----------------------------------------------------------------------------------------------


def _or_eval(evs: tuple[Eval, ...]) -> Eval:
    def ev(p: Props) -> Value:
        acc = evs[0](p)
        for nxt in evs[1:]:
            if acc is True:
                return True
            rv = nxt(p)
            acc = True if rv is True else (None if acc is None or rv is None else False)
        return acc
    return ev


def _and_eval(evs: tuple[Eval, ...]) -> Eval:
    def ev(p: Props) -> Value:
        acc = evs[0](p)
        for nxt in evs[1:]:
            if acc is False:
                return False
            rv = nxt(p)
            acc = False if rv is False else (None if acc is None or rv is None else True)
        return acc
    return ev


def _not_eval(inner: Eval) -> Eval:
    def ev(p: Props) -> Value:
        v = inner(p)
        return None if v is None else not v
    return ev


def _negate_eval(inner: Eval) -> Eval:
    def ev(p: Props) -> Value:
        v = inner(p)
        if v is None or isinstance(v, (bool, str)):
            return None
        if isinstance(v, _Long):
            return _Long(-v)
        return -v  # type: ignore[operator]
    return ev


def _eq_values(lv: Value, rv: Value) -> Value:
    """RocketMQ's equality: NULL on the left only is unknown, on the right only FALSE, on both TRUE."""
    if lv is None or rv is None:
        return None if rv is not None else lv is None
    if type(lv) is type(rv) and lv == rv:
        return True
    return _compare(lv, rv) == 0


def _equal(ps: _Parser, left: _Node, right: _Node, *, negate: bool) -> _Node:
    for n in (left, right):
        if n.kind == _BOOL_CONST and n.value is None:
            raise SqlFilterError(f"NULL cannot be compared with = or <>: write {left.text[:40]} IS NULL")
    if left.kind == _BOOL_CONST and right.kind == _CONST:
        raise SqlFilterError(f"{left.text} cannot be compared with {right.text[:40]}")
    lev, rev = left.ev, right.ev
    if negate:
        def ev(p: Props) -> Value:
            v = _eq_values(lev(p), rev(p))
            return None if v is None else not v
    else:
        def ev(p: Props) -> Value:
            return _eq_values(lev(p), rev(p))
    return ps.node(_BOOL, ev, f"({left.text} {'<>' if negate else '='} {right.text})", left, right)


def _is(ps: _Parser, left: _Node, what: str, negate: bool) -> _Node:
    lev = left.ev
    if what == "NULL":
        def test(p: Props) -> bool:
            return lev(p) is None
    else:
        want = what == "TRUE"

        def test(p: Props) -> bool:
            v = lev(p)
            return v is not None and _compare(v, want) == 0
    ev: Eval = (lambda p: not test(p)) if negate else test
    return ps.node(_BOOL, ev, f"({left.text} IS {'NOT ' if negate else ''}{what})", left)


_ORDER: dict[str, Callable[[int], bool]] = {
    ">": lambda c: c > 0, ">=": lambda c: c >= 0, "<": lambda c: c < 0, "<=": lambda c: c <= 0,
}


def _check_orderable(n: _Node) -> None:
    if (n.kind == _CONST and not isinstance(n.value, (int, float))) or n.kind in (_BOOL, _BOOL_CONST):
        raise SqlFilterError(f"{n.text[:60]} cannot be compared with <, <=, > or >= (only numbers can)")


def _order(ps: _Parser, op: str, left: _Node, right: _Node) -> _Node:
    _check_orderable(left)
    _check_orderable(right)
    lev, rev, accept = left.ev, right.ev, _ORDER[op]

    def ev(p: Props) -> Value:
        lv = lev(p)
        if lv is None:
            return None
        rv = rev(p)
        if rv is None:
            return None
        if isinstance(lv, str) and isinstance(rv, str):
            return accept(_cmp_double(_java_double(lv), _java_double(rv)))
        return accept(_compare(lv, rv))
    return ps.node(_BOOL, ev, f"({left.text} {op} {right.text})", left, right)


def _between(ps: _Parser, value: _Node, low: _Node, high: _Node, negate: bool) -> _Node:
    if negate:
        parts = (_order(ps, "<", value, low), _order(ps, ">", value, high))
        return ps.node(_BOOL, _or_eval(tuple(p.ev for p in parts)),
                       f"({value.text} NOT BETWEEN {low.text} AND {high.text})", *parts)
    if low.kind in (_CONST, _BOOL_CONST) and high.kind in (_CONST, _BOOL_CONST):
        if low.value is None or high.value is None:
            raise SqlFilterError("BETWEEN bounds cannot be NULL")
        try:
            wrong = _compare(high.value, low.value) < 0
        except _Mismatch:
            raise SqlFilterError(f"BETWEEN bounds {low.text[:40]} and {high.text[:40]} cannot be compared") from None
        if wrong:
            raise SqlFilterError(f"BETWEEN {low.text[:40]} AND {high.text[:40]}: the low bound is above the high one")
    parts = (_order(ps, ">=", value, low), _order(ps, "<=", value, high))
    return ps.node(_BOOL, _and_eval(tuple(p.ev for p in parts)),
                   f"({value.text} BETWEEN {low.text} AND {high.text})", *parts)


def _in(ps: _Parser, left: _Node, items: list[str], negate: bool) -> _Node:
    if left.kind != _PROP:
        raise SqlFilterError(f"IN needs a property on its left, got {left.text[:60]}")
    lev, members = left.ev, frozenset(items)

    def ev(p: Props) -> Value:
        v = lev(p)
        if not isinstance(v, str):
            return None
        return (v in members) != negate
    text = ", ".join(_quote(s) for s in items)
    return ps.node(_BOOL, ev, f"({left.text} {'NOT ' if negate else ''}IN ({text}))", left)


def _text_match(ps: _Parser, word: str, left: _Node, search: str, negate: bool) -> _Node:
    lev = left.ev
    test: Callable[[str], bool] = {
        "CONTAINS": lambda v: search in v, "STARTSWITH": lambda v: v.startswith(search),
        "ENDSWITH": lambda v: v.endswith(search),
    }[word]

    def ev(p: Props) -> Value:
        v = lev(p)
        if not search or not isinstance(v, str):
            return False
        return test(v) != negate
    return ps.node(_BOOL, ev, f"({left.text} {'NOT ' if negate else ''}{word} {_quote(search)})", left)


# --- the compiled filter ------------------------------------------------------------------------------------


class SqlFilter:
    """A compiled SQL92 filter: :meth:`matches` a message's properties. Immutable, thread-safe.

    Build with :func:`compile_sql` (cached by expression).
    """

    __slots__ = ("_ev", "expression")

    def __init__(self, expression: str, ev: Eval) -> None:
        self.expression = expression
        """The expression as given."""
        self._ev = ev

    def evaluate(self, properties: Props) -> bool | None:
        """TRUE, FALSE or None (unknown) for a message with these properties; a failed conversion answers
        FALSE (RocketMQ throws, logs it and does not match). Never raises."""
        try:
            v = self._ev(properties)
        except _Mismatch:
            return False
        return v if v is None or isinstance(v, bool) else False

    def matches(self, properties: Props) -> bool:
        """True only when the expression is TRUE (unknown and failed conversions do not match)."""
        try:
            return self._ev(properties) is True
        except _Mismatch:
            return False

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


def compile_sql(expression: str) -> SqlFilter:
    """Parse ``expression`` once into a filter (cached by expression text: compile per subscription, never per
    message).

    Raises:
        SqlFilterError: not a str, empty, longer than :data:`MAX_SQL_LENGTH`, nested deeper than
            :data:`MAX_SQL_DEPTH`, or not valid in RocketMQ's grammar; the message names the problem and the
            character position.
    """
    if not isinstance(expression, str):
        raise SqlFilterError(f"an SQL92 expression must be a str, got {type(expression).__name__}")
    if len(expression) > MAX_SQL_LENGTH:
        raise SqlFilterError(f"SQL92 expression is {len(expression)} characters, more than "
                             f"MAX_SQL_LENGTH={MAX_SQL_LENGTH}")
    return _compile(expression)


@functools.lru_cache(maxsize=1024)
def _compile(expression: str) -> SqlFilter:
    if not expression.strip():
        raise SqlFilterError("SQL92 expression is empty")
    try:
        root = _Parser(expression).parse()
    except SqlFilterError as e:
        raise SqlFilterError(f"invalid SQL92 expression {expression[:80]!r}: {e}") from None
    return SqlFilter(expression, root.ev)
