"""Values that cross back from the judge: decoded as plain data, bounded, compared on the host.

A call-mode test's result arrives as a pickle the candidate's process made, so everything here
treats it as hostile: only plain data decodes (every class lookup but three exact numeric types is
refused), a value far larger than any equal answer could be is wrong without being decoded, and a
structure that cannot equal the expected value because it holds mappings or sets where the expected
holds none is refused before the unpickler builds it (a dict or set of keys that collide in one
hash bucket costs quadratic time to build). Callers run this off the pool's event loop.
"""

from __future__ import annotations

import base64
import binascii
import decimal
import fractions
import io
import math
import pickle
import pickletools
from collections.abc import Mapping
from typing import Any


class NotPlainData(Exception):
    """A pickle that names a class: refused (only plain builtin data may cross the boundary)."""


class ValueTooLarge(ValueError):
    """A result far larger than any value equal to the expected one: wrong, and not decoded."""


# Exact numeric value types a result may be, besides builtin containers and scalars. Their
# constructors have no side effects, and equality between two of them depends on value alone.
_VALUE_CLASSES: dict[tuple[str, str], type] = {
    ("builtins", "complex"): complex,
    ("fractions", "Fraction"): fractions.Fraction,
    ("decimal", "Decimal"): decimal.Decimal,
}

#: Results up to this size are decoded without further checks: too small to be slow.
SMALL_VALUE_BYTES = 4096
#: A larger result may be at most this many times the size of the expected value's pickle.
SIZE_SLACK = 16
_HASHED_OPCODES = frozenset({"EMPTY_DICT", "DICT", "EMPTY_SET", "FROZENSET", "ADDITEMS", "SETITEM", "SETITEMS"})


class _PlainUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401
        try:
            return _VALUE_CLASSES[(module, name)]
        except KeyError:
            raise NotPlainData(f"{module}.{name}") from None

    def persistent_load(self, pid):
        raise NotPlainData("persistent id")


def plain_loads(data: bytes) -> Any:
    """Decode a pickle that may hold only plain data (None, bool, int, float, complex, str, bytes,
    bytearray, list, tuple, dict, set, frozenset, Fraction, Decimal). Raises ``NotPlainData`` for
    anything else."""
    return _PlainUnpickler(io.BytesIO(data)).load()


def _has_hashed(value: Any, depth: int = 0) -> bool:
    if isinstance(value, (dict, set, frozenset)):
        return True
    if depth < 50 and isinstance(value, (list, tuple)):
        return any(_has_hashed(v, depth + 1) for v in value)
    return False


def decode_value(test: Mapping[str, Any], expected: Any = None, *, bounded: bool = False) -> Any:
    """The plain value of a passed call-mode test entry.

    With ``bounded`` (the host's scoring path), a pickle over ``SMALL_VALUE_BYTES`` and over
    ``SIZE_SLACK`` times the expected value's pickle raises ``ValueTooLarge``, and one that builds a
    dict or set where ``expected`` has none raises ``ValueError``: neither could be equal.
    Raises ``NotPlainData``/``ValueError`` for anything that is not a plain value.
    """
    try:
        raw = base64.b64decode(str(test["value"]), validate=True)
    except (KeyError, binascii.Error) as exc:
        raise ValueError("missing or malformed value") from exc
    if bounded and len(raw) > SMALL_VALUE_BYTES:
        limit = SIZE_SLACK * len(pickle.dumps(expected, protocol=4))
        if len(raw) > max(limit, SMALL_VALUE_BYTES):
            raise ValueTooLarge(f"a result of {len(raw)} bytes cannot equal the expected value")
        if not _has_hashed(expected):
            for opcode, _, _ in pickletools.genops(raw):
                if opcode.name in _HASHED_OPCODES:
                    raise ValueError("a mapping or set where the expected value has none")
    return plain_loads(raw)


#: Float results match the reference's within this relative (and, near zero, absolute) tolerance:
#: a correct solution that sums in another order must not be scored wrong.
FLOAT_REL_TOL = 1e-9
FLOAT_ABS_TOL = 1e-12


def values_equal(value: Any, expected: Any) -> bool:
    """``value == expected``, except that floats inside may differ by rounding."""
    try:
        return bool(value == expected) or _close(value, expected, 0)  # the walk only for near misses
    except RecursionError:
        return False


def _close(value: Any, expected: Any, depth: int) -> bool:
    if depth > 200:
        raise RecursionError
    if type(expected) is float and type(value) in (float, int):
        return math.isclose(value, expected, rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)
    if type(expected) in (list, tuple) and type(value) is type(expected):
        return len(value) == len(expected) and all(_close(v, e, depth + 1) for v, e in zip(value, expected))
    if type(expected) is dict and type(value) is dict:
        return value.keys() == expected.keys() and all(_close(value[k], expected[k], depth + 1) for k in expected)
    return bool(value == expected)
