"""Subclasses of frozen attrs records whose fields are read from a compact state when first used.

The data path builds many records a caller may never read (the messages of a large pull, the results of a batch
send): setting every field through a frozen class's ``__init__`` cost more than the rest of that work. A lazy
subclass holds one slot of state instead, set past the frozen ``__setattr__``, and reads each field through a
property. To every caller it is its base: ``attrs.evolve``, ``copy`` and pickling give a plain base instance with
the same fields, equality compares fields with any instance of the base, and the hash and repr are the base's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

__all__ = ["LazyFields", "read_fields_with"]


class LazyFields:
    """Mixin for a lazy subclass of the frozen attrs class :attr:`plain` (list it before that class)."""

    __slots__ = ()
    plain: ClassVar[type]
    """The attrs class whose fields the subclass reads (set by :func:`read_fields_with`)."""

    def __new__(cls, *args: object, **kwargs: object) -> Any:
        # Only attrs.evolve (and any other caller of the class with fields) gets here: the data path builds its
        # instances with object.__new__. The fields are all given, so a plain instance holds them.
        return cls.plain(*args, **kwargs)

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return self.plain, _values(self)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, self.plain):
            return NotImplemented
        return _values(self) == _values(other)

    def __repr__(self) -> str:
        fields = ", ".join(f"{a.name}={getattr(self, a.name)!r}" for a in attrs.fields(self.plain))
        return f"{self.plain.__name__}({fields})"


def _values(record: Any) -> tuple[object, ...]:
    return attrs.astuple(record, recurse=False)


def read_fields_with(lazy: type, plain: type, readers: Mapping[str, Callable[[Any], Any]], source: str) -> None:
    """Make ``lazy`` read each field of ``plain`` with its reader (a property each; ``source`` names where from,
    in their docs), and hash as ``plain`` does.

    Raises:
        AssertionError: ``readers`` does not cover every field of ``plain``.
    """
    if set(readers) != {a.name for a in attrs.fields(plain)}:
        raise AssertionError(f"{lazy.__name__} must read every field of {plain.__name__}")
    lazy.plain = plain  # type: ignore[attr-defined]
    lazy.__hash__ = plain.__hash__  # type: ignore[method-assign]
    for name, read in readers.items():
        setattr(lazy, name, property(read, doc=f"``{name}``, read from {source}."))
