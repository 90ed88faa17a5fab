"""Results that cross back from the judge are bounded before the host decodes them."""

from __future__ import annotations

import base64
import pickle
import random

import pytest

from trl_sandbox.judge.values import SMALL_VALUE_BYTES, ValueTooLarge, decode_value, plain_loads, values_equal

MODULUS = (1 << 61) - 1  # CPython's int hash modulus: multiples of it all hash to 0


def entry(value) -> dict:
    return {"ok": True, "value": base64.b64encode(pickle.dumps(value, protocol=5)).decode()}


def colliding_set(n: int) -> set:
    return {k * MODULUS for k in range(1, n)}


def test_a_colliding_set_is_refused_before_it_is_built():
    crafted = entry(colliding_set(3000))
    expected = list(range(1000))
    with pytest.raises(ValueError, match="mapping or set"):
        decode_value(crafted, expected, bounded=True)
    # positive control: the unbounded decoder builds it (quadratic work the bound avoids)
    assert len(decode_value(crafted)) == 2999


def test_a_result_far_larger_than_the_expected_value_is_wrong_without_decoding():
    huge = entry(list(range(200_000)))
    with pytest.raises(ValueTooLarge):
        decode_value(huge, 7, bounded=True)
    assert len(decode_value(huge)) == 200_000  # positive control


def test_honest_results_decode_under_the_bounds():
    rng = random.Random(0)
    xs = sorted(rng.randint(-1000, 1000) for _ in range(2000))
    assert len(pickle.dumps(xs)) > SMALL_VALUE_BYTES  # large enough to take the checked path
    assert values_equal(decode_value(entry(xs), xs, bounded=True), xs)
    expected = {"a": [1, 2], "b": {3}}
    assert values_equal(decode_value(entry(expected), expected, bounded=True), expected)
    assert plain_loads(pickle.dumps(3.5)) == 3.5
