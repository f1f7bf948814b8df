"""SQL92 property filters (:mod:`common.sql92`): answers as RocketMQ's ``SelectorParser`` and
``ComparisonExpression`` give them, what its parser refuses, and a fuzz of the parser.

Each expected value was worked out from RocketMQ's source (filter module, ``SelectorParser.jj``,
``ComparisonExpression.__compare``, ``LogicExpression``, ``UnaryExpression``) with ``convertStringExpressions``
on, as ``SelectorParser.parse`` sets it: True matches; False and None (unknown) do not.
"""

from __future__ import annotations

import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client import MessageSelector
from client.errors import InvalidParameterError
from common.sql92 import MAX_SQL_DEPTH, MAX_SQL_LENGTH, SqlFilterError, compile_sql

PROPS = {
    "region": "EU", "amount": "150", "price": "9.5", "big": "3000000000", "name": "abc", "quote": "it's",
    "flag": "true", "Flag": "TRUE", "no": "false", "neg": "-7", "blank": "", "spaced": " 12 ", "nan": "NaN",
    "TAGS": "TagA", "KEYS": "k1 k2", "zero": "0", "a": "1", "b": "2",
}

# (expression, expected against PROPS, why)
TABLE: list[tuple[str, bool | None, str]] = [
    ("region = 'EU'", True, "string equality"),
    ("region = 'eu'", False, "strings compare case-sensitively"),
    ("region <> 'EU'", False, "<> is NOT ="),
    ("region = 'EU' AND amount > 100", True, "the issue's example"),
    ("amount > 100", True, "'150' read with Integer.valueOf against an Integer literal"),
    ("amount >= 150 AND amount <= 150", True, "bounds included"),
    ("amount < 100", False, "numeric, not string, order"),
    ("amount = 150", True, "= converts the string to the literal's type"),
    ("amount = '150'", True, "string equality"),
    ("amount > 100.0", True, "Double.valueOf against a decimal literal"),
    ("price > 9", False, "Integer.valueOf('9.5') fails: the evaluation aborts, no match"),
    ("price > 9.0", True, "Double.valueOf('9.5')"),
    ("price = 9.5", True, "equal doubles"),
    ("big > 1", False, "3000000000 does not fit Integer.valueOf: aborted"),
    ("big > 2147483648", True, "a literal beyond 32 bits is a Long: Long.valueOf fits"),
    ("neg < 0", True, "signed numbers parse"),
    ("neg = -7", True, "unary minus on a literal"),
    ("spaced > 11", False, "Integer.valueOf does not trim"),
    ("spaced > 11.0", True, "Double.valueOf trims spaces"),
    ("nan > 1.0", True, "Double.compareTo puts NaN above everything"),
    ("name > 1", False, "a string that is no number: aborted"),
    ("NOT (name > 1)", False, "an aborted evaluation stays unmatched under NOT"),
    ("name > 1 OR region = 'EU'", False, "OR evaluates left first; the abort wins"),
    ("region = 'EU' OR name > 1", True, "OR stops at its first TRUE"),
    ("region = 'XX' AND name > 1", False, "AND stops at its first FALSE"),
    ("a > b", False, "two properties compare as doubles: 1 > 2 is false"),
    ("b > a", True, "two properties compare as doubles"),
    ("missing > 1", None, "a comparison with a missing property is unknown"),
    ("missing = 1", None, "NULL on the left of = is unknown"),
    ("1 = missing", False, "NULL on the right only of = is FALSE (RocketMQ's equality)"),
    ("missing = other", True, "two missing properties are equal"),
    ("NOT (missing > 1)", None, "NOT unknown is unknown"),
    ("missing IS NULL", True, "IS NULL"),
    ("region IS NULL", False, "IS NULL on a present property"),
    ("region IS NOT NULL", True, "IS NOT NULL"),
    ("missing IS NOT NULL", False, "IS NOT NULL on a missing property"),
    ("blank IS NULL", False, "an empty value is present"),
    ("missing > 1 OR region = 'EU'", True, "unknown OR TRUE"),
    ("missing > 1 OR region = 'XX'", None, "unknown OR FALSE"),
    ("missing > 1 AND region = 'XX'", False, "unknown AND FALSE"),
    ("missing > 1 AND region = 'EU'", None, "unknown AND TRUE"),
    ("quote = 'it''s'", True, "'' escapes a quote"),
    ("flag = TRUE", True, "Boolean.valueOf('true')"),
    ("Flag = TRUE", True, "Boolean.valueOf ignores case"),
    ("no = FALSE", True, "Boolean.valueOf('false') is false"),
    ("name = FALSE", True, "Boolean.valueOf of anything but 'true' is false"),
    ("flag IS TRUE", True, "IS TRUE reads like = TRUE"),
    ("missing IS TRUE", False, "IS TRUE is never unknown"),
    ("missing IS NOT TRUE", True, "IS NOT TRUE of unknown"),
    ("no IS FALSE", True, "IS FALSE"),
    ("(amount > 100) IS TRUE", True, "IS TRUE on a comparison"),
    ("region", False, "a property used as a boolean: a string is FALSE"),
    ("NOT region", True, "NOT of the cast"),
    ("missing", None, "a missing property as a boolean is unknown"),
    ("TRUE", True, "a constant"),
    ("NULL", None, "NULL matches nothing"),
    ("TRUE OR FALSE AND FALSE", True, "AND binds tighter than OR"),
    ("(TRUE OR FALSE) AND FALSE", False, "parentheses"),
    ("NOT FALSE AND FALSE", False, "NOT binds tighter than AND"),
    ("NOT TRUE = FALSE", True, "NOT binds tighter than = : (NOT TRUE) = FALSE"),
    ("NOT region = 'US'", False, "(NOT region) = 'US': a boolean against a string aborts in RocketMQ"),
    ("NOT amount = 1", False, "(NOT amount) = 1: a boolean never equals a number"),
    ("NOT (region = 'US')", True, "what was meant"),
    ("amount BETWEEN 100 AND 200", True, "BETWEEN"),
    ("amount BETWEEN 151 AND 200", False, "BETWEEN outside"),
    ("amount NOT BETWEEN 151 AND 200", True, "NOT BETWEEN"),
    ("missing BETWEEN 1 AND 2", None, "BETWEEN on a missing property"),
    ("missing NOT BETWEEN 1 AND 2", None, "NOT BETWEEN on a missing property"),
    ("amount BETWEEN -5 AND 1000", True, "a negative bound"),
    # Both bounds are inclusive (SQL92; RocketMQ's BETWEEN is >= low AND <= high), and NOT BETWEEN excludes them.
    ("amount BETWEEN 150 AND 200", True, "BETWEEN includes its low bound"),
    ("amount BETWEEN 100 AND 150", True, "BETWEEN includes its high bound"),
    ("amount BETWEEN 150 AND 150", True, "BETWEEN of one value"),
    ("amount NOT BETWEEN 150 AND 200", False, "NOT BETWEEN excludes its low bound"),
    ("amount NOT BETWEEN 100 AND 150", False, "NOT BETWEEN excludes its high bound"),
    ("TAGS IN ('TagA', 'TagB')", True, "TAGS is a property"),
    ("TAGS NOT IN ('TagA', 'TagB')", False, "NOT IN"),
    ("region IN ('US')", False, "IN miss"),
    ("missing IN ('x')", None, "IN on a missing property is unknown"),
    ("missing NOT IN ('x')", None, "NOT IN on a missing property is unknown"),
    ("KEYS = 'k1 k2'", True, "system properties are properties"),
    ("name CONTAINS 'b'", True, "CONTAINS"),
    ("name NOT CONTAINS 'b'", False, "NOT CONTAINS"),
    ("missing CONTAINS 'b'", False, "CONTAINS of a missing property is FALSE, not unknown"),
    ("name STARTSWITH 'ab' AND name ENDSWITH 'bc'", True, "STARTSWITH / ENDSWITH"),
    ("name CONTAINS ''", False, "an empty search matches nothing"),
    ("region = 'EU' -- a comment\n AND amount > 1", True, "line comment"),
    ("region /* a */ = /* b */ 'EU'", True, "block comments"),
    ("region = 'EU' and AMOUNT > 1", None, "keywords ignore case, properties do not: AMOUNT is missing"),
    ("zero = 0", True, "zero"),
    ("-amount < 0", None, "negating a string property gives NULL"),
    ("5 = TRUE", False, "a number against a boolean is never equal"),
    ("1 < 2", True, "constants compare"),
    ("1 = 1.0", True, "an Integer converted to a Double"),
    ("amount = 150L", True, "a Long suffix"),
]

# Expressions RocketMQ's parser refuses (MQFilterException "Invalid MessageSelector").
ERRORS: list[tuple[str, str]] = [
    ("quote = 'it's'", "never closed"),
    ("region = ", "expected a value"),
    ("region > 'EU'", "cannot be compared"),
    ("TRUE > 1", "cannot be compared"),
    ("region = NULL", "IS NULL"),
    ("TRUE = 5", "cannot be compared"),
    ("amount BETWEEN 200 AND 100", "low bound"),
    ("amount BETWEEN NULL AND 100", "NULL"),
    ("5 IN ('a')", "IN needs a property"),
    ("region IN (1, 2)", "'string' literal"),
    ("region IN ()", "'string' literal"),
    ("region AND 5", "not a boolean"),
    ("NOT 5", "not a boolean"),
    ("'abc'", "not a boolean"),
    ("0.0 < a", "Double.MIN_VALUE"),
    ("a > 9223372036854775808", "64-bit"),
    ("(a = 1", "')'"),
    ("a = 1)", "unexpected"),
    ("a == 1", "expected a value"),
    ("a = 'open", "never closed"),
    ("a = 1 /* open", "never closed"),
    ("a # 1", "unexpected character"),
    ("région = 1", "unexpected character"),
    ("a IS 5", "NULL, TRUE or FALSE"),
    ("a > 1 > 2", "cannot be compared"),
    ("a BETWEEN 1 OR 2", "AND of BETWEEN"),
    ("", "empty"),
    ("   ", "empty"),
]


@pytest.mark.parametrize(("expression", "expected", "why"), TABLE, ids=[r[0] for r in TABLE])
def test_expression_table(expression: str, expected: bool | None, why: str) -> None:
    flt = compile_sql(expression)
    got = flt.evaluate(PROPS)
    assert got is expected, f"{expression!r} gave {got}, RocketMQ gives {expected} ({why})"
    assert flt.matches(PROPS) is (expected is True)


def test_the_table_is_large_enough() -> None:
    assert len(TABLE) >= 40


@pytest.mark.parametrize(("expression", "fragment"), ERRORS, ids=[e for e, _ in ERRORS])
def test_refused_with_a_clear_error(expression: str, fragment: str) -> None:
    with pytest.raises(SqlFilterError, match="SQL92") as info:
        compile_sql(expression)
    assert fragment in str(info.value), str(info.value)


def test_bounds_are_named() -> None:
    with pytest.raises(SqlFilterError, match=f"MAX_SQL_LENGTH={MAX_SQL_LENGTH}"):
        compile_sql("a = 1 OR " * 1000 + "TRUE")
    deep = "(" * (MAX_SQL_DEPTH + 1) + "a = 1" + ")" * (MAX_SQL_DEPTH + 1)
    with pytest.raises(SqlFilterError, match="MAX_SQL_DEPTH"):
        compile_sql(deep)
    with pytest.raises(SqlFilterError, match="MAX_SQL_DEPTH"):
        compile_sql("NOT " * (MAX_SQL_DEPTH + 1) + "TRUE")
    with pytest.raises(SqlFilterError, match="MAX_SQL_DEPTH"):
        compile_sql("a = 1" + " = TRUE" * (MAX_SQL_DEPTH + 1))
    # A long flat OR chain is not deep: it evaluates without recursion trouble.
    flat = " OR ".join(f"a = {i}" for i in range(300))
    assert compile_sql(flat).matches({"a": "299"})
    with pytest.raises(SqlFilterError, match="must be a str"):
        compile_sql(["a = 1"])  # type: ignore[arg-type]


def test_compiled_once_per_expression() -> None:
    assert compile_sql("region = 'EU'") is compile_sql("region = 'EU'")


def test_selector_validates_early() -> None:
    assert MessageSelector.sql("a > 1").is_sql
    assert MessageSelector.of("TagA || TagB") == MessageSelector.tags("TagA || TagB")
    assert not MessageSelector.of(None).is_sql
    with pytest.raises(InvalidParameterError, match="cannot be compared"):
        MessageSelector.sql("a > 'x'")


# --- fuzz ---------------------------------------------------------------------------------------------------

_ATOMS = ["a", "b", "TAGS", "region", "1", "-2", "2.5", "9999999999", "'EU'", "'it''s'", "TRUE", "FALSE", "NULL",
          "(", ")", "=", "<>", "<", "<=", ">", ">=", "AND", "OR", "NOT", "IS", "BETWEEN", "IN", ",", "CONTAINS",
          "STARTSWITH", "ENDSWITH", "'", "--", "/*", "*/", "0.0", "1e400", ".5", "5.", "+", "-", "$x", "_y"]
_VALID = ["region = 'EU' AND amount > 100", "a BETWEEN 1 AND 5 OR b IN ('x', 'y')", "NOT (a IS NULL)",
          "TAGS IN ('A') AND (b <> 'x' OR c IS NOT TRUE)", "a > 1.5 AND NOT b = TRUE"]
_FUZZ_PROPS = st.dictionaries(st.sampled_from(["a", "b", "c", "TAGS", "region", "amount"]),
                              st.one_of(st.sampled_from(["1", "-2", "2.5", "x", "", "NaN", "true", "EU", " 3 "]),
                                        st.text(max_size=6)), max_size=6)


def _check(expression: str, props: dict[str, str]) -> None:
    # This thread's CPU time, not the wall clock: a busy machine stretched one 0.1 s parse past the bound; a
    # parser that backtracks exponentially on these short inputs takes far more than a second of CPU.
    started = time.thread_time()
    try:
        flt = compile_sql(expression)
    except SqlFilterError as e:
        assert str(e), "an error without a message"
    else:
        assert flt.evaluate(props) in (True, False, None)
    assert time.thread_time() - started < 1.0, f"{expression[:80]!r} took too long"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(_ATOMS), max_size=25).map(" ".join), _FUZZ_PROPS)
def test_fuzz_token_soup(expression: str, props: dict[str, str]) -> None:
    _check(expression, props)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(_VALID), st.integers(0, 200), st.integers(0, 5), st.text(max_size=4), _FUZZ_PROPS)
def test_fuzz_mutated_valid(base: str, at: int, cut: int, insert: str, props: dict[str, str]) -> None:
    at %= len(base) + 1
    _check(base[:at] + insert + base[at + cut:], props)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), _FUZZ_PROPS)
def test_fuzz_any_text(expression: str, props: dict[str, str]) -> None:
    _check(expression, props)


def test_fuzz_large_inputs_stay_bounded() -> None:
    for expression in ("(" * 5000, "NOT " * 3000, "'" * MAX_SQL_LENGTH, "a IN (" + "'x'," * 900 + "'y')",
                       "a = 1 OR " * 400 + "b = 2", "-" * MAX_SQL_LENGTH + "1 = 1"):
        _check(expression, {"a": "x"})
