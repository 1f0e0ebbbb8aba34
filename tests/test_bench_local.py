"""benchmarks/bench_local.py runs in one command: a row per library and setting, the interpreter's
own rows, and the JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def test_it_prints_a_row_per_setting_and_saves_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_local

    out = tmp_path / "local.json"
    bench_local.main(["--calls", "2", "--json", str(out)])
    rows = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line
    ]
    libraries = [row.split(" | ")[0][2:] for row in rows[1:]]
    assert libraries.count("numpy") == len(bench_local.CASES) and libraries.count("run_rank") == 3
    saved = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert [r["library"] for r in saved] == libraries and all(r["median_ms"] > 0 for r in saved)


def test_too_few_calls_is_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_local

    with pytest.raises(SystemExit) as done:
        bench_local.main(["--calls", "0"])
    assert (
        done.value.code == 2
        and "argument --calls: '0': need a whole number from 1 to 100,000" in capsys.readouterr().err
    )
