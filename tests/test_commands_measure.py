"""``run`` and ``bench`` (:mod:`stragglar.commands.measure`) on the local backend: results checked and
reported, rows and JSON saved, and bad arguments refused in one line."""

from __future__ import annotations

import datetime
import importlib.machinery
import json
import re
import sys
import types
from pathlib import Path

import pytest
from cli_results import one_error, run

from stragglar.formats import schedule_json
from stragglar.synth import synthesize


def test_run_local_checks_the_result_and_reports_both_algorithms() -> None:
    result = run("run", "--gpus", "5", "--size", "3KiB", "--dtype", "int64", "--delay", "1ms", "--iters", "2")
    assert result.exit_code == 0, result.output
    head, ours, baseline, speedup, note = result.output.splitlines()
    assert head.startswith("stragglar against sum of buffers on local: 5 ranks") and "results checked" in head
    assert "ms/iter" in ours and ours.split()[0] == "stragglar"
    assert baseline.split()[0] == "sum" and speedup.strip().startswith("speed-up")
    assert note.startswith("  note: in one process") and "nothing of a network" in note


def test_run_a_schedule_file(tmp_path: Path) -> None:
    path = tmp_path / "ring.json"
    schedule_json.write(synthesize("ring", 3), path)
    result = run("run", "--gpus", "3", "--schedule", str(path), "--size", "100", "--iters", "1")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ring against sum of buffers on local: 3 ranks")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--size", "12XB"], "'--size': unknown size unit 'xb'"),
        (["--delay", "soon"], "'--delay': expected a duration"),
        (["--delay", "-5ms"], "'--delay': expected a duration"),
        (["--delay", "5"], "'--delay': '5' needs a unit: write 5ms or 5s"),
        (["--dtype", "complex64"], "--dtype"),
        (["--backend", "mpi"], "--backend"),
        (["--size", "2B", "--dtype", "int64"], "need size >= one element"),
    ],
)
def test_run_bad_arguments(args: list[str], message: str) -> None:
    assert message in one_error(run("run", "--gpus", "4", *args), 2)


@pytest.mark.parametrize("backend", ["torch", "cupy"])
def test_run_names_the_extra_a_missing_backend_needs(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # as if not installed: find_spec gives None
    message = one_error(run("run", "--backend", backend, "--gpus", "2"), 2)
    names = {"torch": ["install PyTorch"], "cupy": ["pip install cupy-cuda12x or cupy-cuda13x"]}[backend]
    assert message.startswith(f"Error: the {backend} backend needs {backend}: ")
    assert all(name in message for name in names) and "http" not in message


def test_run_on_cupy_without_a_gpu_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_device() -> int:
        """cudaErrorNoDevice: no CUDA-capable device is detected"""
        raise RuntimeError(no_device.__doc__)

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=no_device))  # type: ignore[attr-defined]
    cupy.__spec__ = importlib.machinery.ModuleSpec("cupy", None)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    message = one_error(run("run", "--backend", "cupy", "--gpus", "2", "--size", "1KiB"), 2)
    assert message == f"Error: the cupy backend found no usable GPU: {no_device.__doc__}"


def test_run_refuses_a_schedule_for_another_size(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    schedule_json.write(synthesize("stragglar", 4), path)
    assert f"--gpus 6 but {path} is for 4 ranks" in one_error(
        run("run", "--gpus", "6", "--schedule", str(path)), 2
    )


def test_bench_local_prints_one_row_per_setting_and_saves_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = [
        "--backend",
        "local",
        "--gpus",
        "3,4",
        "--sizes",
        "1KiB,3KiB",
        "--delays",
        "0,1ms",
        "--iters",
        "2",
    ]
    result = run("bench", *args, "--json", str(out))
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \d", line)]
    assert [row.split(" | ")[:3] for row in rows] == [
        [f"| {n}", size, delay] for n in "34" for size in ("1 KiB", "3 KiB") for delay in ("0", "1")
    ]
    assert all(row.endswith("| - |") for row in rows)  # the sum of buffers is no ring: no model
    assert result.stderr == ""  # a progress bar on a terminal only: quiet in pipes and CI
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["backend"] == "local" and doc["baseline"] == "sum of buffers" and len(doc["settings"]) == 8
    assert {s["num_ranks"] for s in doc["settings"]} == {3, 4} and doc["fits"] == {}
    assert doc["date"] == datetime.date.today().isoformat() and "CPUs, Python 3." in doc["machine"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gpus", "4,,8"], "'--gpus': expected rank counts like 4,8"),
        (["--gpus", "four"], "'--gpus': expected rank counts like 4,8"),
        (["--gpus", "1"], "need 2 to 2048 GPUs"),
        (["--sizes", "1KiB,9ZB"], "'--sizes': unknown size unit 'zb'"),
        (["--sizes", "1KiB,,2KiB"], "'--sizes': expected a comma-separated list"),
        (["--delays", "0,later"], "'--delays': expected a duration"),
    ],
)
def test_bench_bad_arguments(args: list[str], message: str) -> None:
    assert message in one_error(run("bench", "--backend", "local", "--iters", "1", *args), 2)


@pytest.mark.parametrize(
    "args, said",
    [
        (["bench", "--gpus", "four"], "--gpus"),
        (["run", "--backend", "torch", "--gpus", "4", "--chunks", "8", "--alpha", "1ms"], "--alpha does not"),
        (["run", "--backend", "torch", "--gpus", "4", "--link-rate", "1kB/s"], "link rate must be"),
    ],
)
def test_every_option_is_checked_before_the_backend_s_library(
    monkeypatch: pytest.MonkeyPatch, args: list[str], said: str
) -> None:
    """A machine without torch hears about its bad option first, as one with torch does."""
    from stragglar.errors import InputError

    def missing(backend: str) -> None:
        raise InputError(f"the {backend} backend needs its library")

    monkeypatch.setattr("stragglar.commands.measure.check_backend", missing)
    line = one_error(run(*args), 2)
    assert said in line and "needs its library" not in line, line
