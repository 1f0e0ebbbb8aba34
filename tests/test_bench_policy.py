"""benchmarks/bench_policy.py: the auto policy's decision of a bucket timed as the hook meets it
(a step's first bucket, its next ones), and the verdicts under the table on rows whose truth is
known."""

from __future__ import annotations

from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_a_setting_is_timed_every_way_and_bets_with_the_count_its_cache_gives(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_policy

    from stragglar.model import best_chunks_over

    result = bench_policy.bench(8, 2**30, calls=5)
    assert min(result.judgement_us, result.ranking_us, result.fastest_us, result.first_bucket_us) > 0
    assert result.next_bucket_us > 0
    # the bet's count is the fastest over the record the repeated calls met (the cache's answer)
    assert result.chunks == best_chunks_over(8, 2**30, bench_policy.record(5), bench_policy.NETWORK)
    records = {bench_policy.record(i) for i in range(50)}
    assert len(records) == 50  # a new record each call: the first-bucket row never meets the cache


def test_the_verdicts_under_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_policy

    met = bench_policy.Result(8, 2**30, 50.0, 6000.0, 200.0, 300.0, 12.0, 91)
    slow = bench_policy.Result(64, 25 * 2**20, 2500.0, 6000.0, 300.0, 1500.0, 25.0, None)
    shown = bench_policy.table([met])
    assert "| 8 | 1024 MiB | 50 | 6,000 | 200 | 300 | 12.0 | 91 |" in shown
    assert "judgement, worst setting: 50 us (target <= 2000 us: met)" in shown
    assert "worst setting: 300 us (target <= 1000 us: met)" in shown
    assert "worst setting: 12.0 us (target <= 20 us: met)" in shown
    assert shown.endswith("30x less time (median)")
    shown = bench_policy.table([met, slow])
    assert "| 64 | 25 MiB | 2,500 | 6,000 | 300 | 1,500 | 25.0 | 63 |" in shown
    assert "2,500 us (target <= 2000 us: MISSED)" in shown
    assert "1,500 us (target <= 1000 us: MISSED)" in shown and "25.0 us (target <= 20 us: MISSED)" in shown
