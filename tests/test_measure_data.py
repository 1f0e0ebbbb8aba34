"""Test data for measured runs: exact in its dtype however summed, distinct per rank, never all zeros."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stragglar.measure.data import EXACT, encoding, expected, payload, payloads
from stragglar.runtime import DTYPES

SIGNIFICAND = {"float16": 11, "bfloat16": 8, "float32": 24, "float64": 53}


def rows(n: int, count: int, dtype: str) -> np.ndarray:
    """Every rank's payload; spot-checked against the one-rank function."""
    data = payloads(count, n, dtype)
    for r in {0, n // 3, n - 1}:
        assert np.array_equal(data[r], payload(r, count, n, dtype))
    return data


def in_dtype(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` cast to ``dtype`` and back to int64 (bfloat16 through torch, else NumPy)."""
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        result: np.ndarray = torch.from_numpy(values).to(torch.bfloat16).to(torch.int64).numpy()
        return result
    return values.astype(dtype).astype(np.int64)


def accumulate(values: np.ndarray, dtype: str) -> np.ndarray:
    """Running sums over axis 0, every addition rounded to ``dtype``."""
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        acc = torch.zeros(values.shape[1], dtype=torch.bfloat16)
        out = []
        for row in torch.from_numpy(values).to(torch.bfloat16):
            acc = acc + row
            out.append(acc.to(torch.int64).numpy())
        return np.array(out)
    return np.add.accumulate(values.astype(dtype), axis=0, dtype=dtype).astype(np.int64)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    dtype=st.sampled_from(DTYPES),
    n=st.one_of(st.integers(2, 40), st.integers(2, 4096)),
    draw=st.data(),
    seed=st.integers(0, 2**32 - 1),
)
def test_payload_is_exact_distinct_and_never_all_zero(
    dtype: str, n: int, draw: st.DataObject, seed: int
) -> None:
    enc = encoding(n, dtype)
    count = draw.draw(st.integers(1, enc.window + 40), label="count")
    data = rows(n, count, dtype)
    assert np.array_equal(in_dtype(data, dtype), data)  # every value exact in the dtype
    # any partial sum in any order stays within the exact range: the sum of magnitudes does
    assert int(np.abs(data).sum(axis=0).max()) <= EXACT[dtype]
    if dtype in SIGNIFICAND:
        assert EXACT[dtype] == 2 ** SIGNIFICAND[dtype]
    assert int(np.abs(data).max()) <= max(1, EXACT[dtype] // n)  # at most floor(2**p / N) units
    # summed in the dtype itself, in rank order, reversed and shuffled, every running sum is exact
    order = np.random.default_rng(seed).permutation(n)
    for perm in (np.arange(n), order[::-1], order):
        if n * count <= 300_000 or dtype != "bfloat16":  # bfloat16 sums go row by row through torch
            assert np.array_equal(accumulate(data[perm], dtype), np.cumsum(data[perm], axis=0))
    assert np.array_equal(data.sum(axis=0), expected(count, n, dtype))
    if count >= enc.groups:  # room for every rank's unit (dense data: from one element on)
        assert np.all(np.abs(data).sum(axis=1) > 0)  # no rank is all zeros
    if count >= enc.window:  # room for every rank's identity
        assert len(np.unique(data, axis=0)) == n  # no two ranks have equal data


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [2, 3, 8, 17, 100, 128, 129, 256, 257, 1024, 1025, 2048, 2049, 4096])
def test_guarantees_start_early_and_values_vary(dtype: str, n: int) -> None:
    enc = encoding(n, dtype)
    # no rank all zeros from (at most twice) the count that makes room for every rank's unit
    assert enc.groups <= max(1, 2 * -(-n // EXACT[dtype]))
    assert enc.window <= enc.groups * n.bit_length()  # one digit per bit of the rank at most
    data = rows(n, max(64, enc.window), dtype)
    assert np.all(np.abs(data).sum(axis=1) > 0)
    assert len(np.unique(data, axis=0)) == n
    for r in (0, n // 2, n - 1):
        assert len(set(data[r].tolist())) >= 2  # values vary over the elements
    if enc.dense:
        assert np.all(data != 0)  # dense data: every value nonzero, a dropped one always shows


def test_the_old_collapses_are_gone() -> None:
    """bfloat16 from N = 129 and float16 from 1025 were all zeros; bfloat16 from 17 repeated ranks."""
    for n, dtype in [(129, "bfloat16"), (200, "bfloat16"), (1025, "float16"), (3000, "float16")]:
        data = rows(n, 256, dtype)
        assert np.count_nonzero(data) > data.size // 4
        assert len(np.unique(data, axis=0)) == n
    data = rows(17, 64, "bfloat16")
    assert len(np.unique(data, axis=0)) == 17


def test_payload_differs_per_rank_and_element_for_wide_dtypes() -> None:
    for dtype in ("float32", "float64", "int32", "int64"):
        a, b = payload(0, 1000, 8, dtype), payload(1, 1000, 8, dtype)
        assert len(set(a.tolist())) > 990 and np.all(a != b)  # distinct per element and rank
        assert np.all(a != 0) and (a > 0).any() and (a < 0).any()
