"""benchmarks/bench_gpu.py without a GPU: one line and exit 0; and its loopback part on the CuPy
stand-in (:mod:`fake_cupy`), which runs the same batched rounds and graphs, checked every call."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fake_cupy import FakeCuda, installed

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCuda]:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    yield from installed(monkeypatch)


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "bench_gpu.py")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.startswith("no GPU: ") and done.stdout.count("\n") == 1, done.stdout


def test_the_loopback_part_times_eager_and_graph_calls_and_checks_each(cuda: FakeCuda) -> None:
    import gpu_loopback

    rows = gpu_loopback.loopback(sys.modules["cupy"], lambda: None, (4,), (4 << 10,), iters=2, progress=print)
    assert [(r.n, r.chunks, r.size_bytes) for r in rows] == [(4, 3, 4096), (4, 32, 4096)]
    assert all(r.eager_ms > 0 and r.graph_ms > 0 and r.rounds > 0 for r in rows)
    # 2 ranges x 2 schedules: captured on the first graph call (the eager calls compiled the
    # kernels) and replayed in each of the 3 graph calls
    assert cuda.captures == 4 and cuda.replays == 2 * 2 * 3
    table = gpu_loopback.loopback_table(rows)
    assert "| 4 | 32 | 4 KiB |" in table and table.count("\n") == 3


def test_a_wrong_result_stops_the_benchmark(cuda: FakeCuda) -> None:
    import gpu_loopback

    bufs = [np.zeros(10, np.float32) for _ in range(3)]
    gpu_loopback.fill(np, bufs)
    bufs[1][7] += 1  # as if a round had lost or misplaced a piece
    from gpu_inputs import Wrong

    with pytest.raises(Wrong, match="rank 0 has 10 wrong elements of 10"):
        gpu_loopback.verify(np, bufs, "N=3")


def test_the_rank_parts_run_on_gloo_and_check_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parts (b) and (c) with host waits on 2 gloo ranks, tiny: what the GPU run times, checked."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu
    from gpu_inputs import DDPConfig, P2PConfig

    times = bench_gpu.p2p(P2PConfig("gloo", (4096,), (0.0, 0.02), 1, timeout=30), 2, 0)
    names = [n for n in times if n != "pair"]
    assert names == [
        "4096|0.0|stragglar paper, host waits",
        "4096|0.0|stragglar chunked, host waits",
        "4096|0.0|gloo all_reduce",
        "4096|0.02|stragglar paper, host waits",
        "4096|0.02|stragglar chunked, host waits",
        "4096|0.02|gloo all_reduce",
    ]
    assert all(times[n] >= 0.02 for n in names if "|0.02|" in n)  # the slowest rank waited
    assert times["pair"] > 0
    table = bench_gpu.p2p_table(times, 2)
    assert "| 4 KiB | 20 | stragglar paper, host waits |" in table and "bare send/recv pair, 4 KiB" in table
    cfg = DDPConfig("gloo", 16, 2, 0.001, 4, 1, 1, 0.01, timeout=30)
    run = bench_gpu.ddp(cfg, 2, 0, bench_gpu.DDP_VARIANTS)
    assert set(run) == set(bench_gpu.DDP_VARIANTS)
    assert all(figures["loss_rel_diff"] < 1e-5 for figures in run.values())  # the same training
    assert all(figures["median_step_s"] >= 0.01 for figures in run.values())  # rank 1 came late
    assert "nobody late" not in bench_gpu.ddp_table({"rank 1 late": run})
    assert run["default hook"]["chunks"] == [] and run["stragglar (paper)"]["chunks"] == [1]
    assert run["stragglar (chunks auto)"]["chunks"] == [1]  # the model's choice for 2 ranks, tiny buckets


def test_chunks_auto_on_the_paper_s_own_schedule_is_called_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the model chose the paper's chunk count for every bucket, the two variants ran one
    schedule: a "MISSED" against it says so (on an H200, 4 ranks: 1.05x nobody late, 0.99x late)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    def runs(auto_chunks: list[int]) -> dict[str, dict[str, Any]]:
        figures = {"median_step_s": 1.0, "loss_rel_diff": 0.0, "chunks": [3]}
        return {
            "nobody late": {
                "default hook": {**figures, "chunks": []},
                "stragglar (paper)": figures,
                "stragglar (chunks auto)": {**figures, "median_step_s": 1.05, "chunks": auto_chunks},
                "auto": {**figures, "chunks": []},
            }
        }

    same = bench_gpu.ddp_targets(runs([3]))[0]
    assert same.endswith("MISSED, but both ran [3] chunks: the same schedule, the difference is noise)")
    assert bench_gpu.ddp_targets(runs([3, 12]))[0].endswith("(target <= 1: MISSED)")


def test_the_cupy_nccl_part_says_why_it_has_no_figures_or_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Part (d) without CuPy says so; with a CuPy whose NCCL cannot start, the ranks fail and the
    part raises (main reports it in one line and goes on: see the next test)."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu
    from gpu_inputs import P2PConfig

    from stragglar.measure.launch import LaunchError

    cfg = P2PConfig("gloo", (4096,), (0.0,), 1, timeout=30)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    if importlib.util.find_spec("cupy") is not None:
        pytest.skip("CuPy is installed here")
    assert bench_gpu.cupy_nccl(cfg, 2, 0) == "not measured: cupy is not installed"
    next(installed(monkeypatch))  # a CuPy without cupy.cuda.nccl: every rank fails at once
    with pytest.raises(LaunchError):
        bench_gpu.cupy_nccl(cfg, 2, 0)


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """bench_gpu with one GPU and parts that return their names (or fail where told), and the
    device named without CUDA."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    from stragglar.measure.launch import LaunchError

    ran: list[str] = []
    failing: set[str] = set()

    def runner(part: str) -> Any:
        def run(args: Any, gpus: int) -> Any:
            ran.append(part)
            if part in failing:
                raise LaunchError({2: f"Traceback ...\nRuntimeError: {part} went wrong"}, 4)
            return {"figure": f"{part} on {gpus}"}

        return run

    monkeypatch.setattr(bench_gpu, "gpu_count", lambda: 1)
    monkeypatch.setattr(bench_gpu, "driver_device_name", lambda: "Test GPU")
    monkeypatch.setattr(bench_gpu, "RUNNERS", {p: runner(p) for p in bench_gpu.PARTS})
    monkeypatch.setattr(bench_gpu, "ran", ran, raising=False)
    monkeypatch.setattr(bench_gpu, "failing", failing, raising=False)
    yield bench_gpu


def test_a_part_whose_ranks_fail_is_one_line_and_the_others_still_run(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    bench.failing.add("p2p")
    path = tmp_path / "gpu.json"
    with pytest.raises(SystemExit) as done:
        bench.main(["--json", str(path)])
    assert done.value.code == 1
    assert bench.ran == list(bench.PARTS)  # the loopback last, after the forked ranks' parts
    shown = [line for line in capsys.readouterr().out.splitlines() if "FAILED" in line]
    assert len(shown) == 1 and shown[0].startswith("## p2p: FAILED: 1 of 4 ranks failed: rank 2")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["p2p"] == shown[0].removeprefix("## p2p: ")
    assert doc["loopback"] == {"figure": "loopback on 1"} and doc["complete"] is True


def test_parts_rerun_some_and_keep_the_others_of_the_same_device(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "gpu.json"
    bench.main(["--parts", "loopback", "--json", str(path)])
    first = json.loads(path.read_text(encoding="utf-8"))
    assert first["complete"] is False and first["device"] == "Test GPU" and "p2p" not in first
    bench.main(["--parts", "ddp", "p2p", "--json", str(path)])
    assert bench.ran == ["loopback", "p2p", "ddp"]  # in the parts' order, not the option's
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["loopback"] == first["loopback"] and doc["ddp"] == {"figure": "ddp on 1"}
    assert doc["complete"] is False  # cupy_nccl never ran
    doc["device"] = "Another GPU"
    path.write_text(json.dumps(doc), encoding="utf-8")
    bench.main(["--parts", "cupy_nccl", "--json", str(path)])
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert set(doc) == {"date", "machine", "device", "complete", "cupy_nccl"}  # another device's: dropped
    assert "not kept from" in capsys.readouterr().out


@pytest.mark.parametrize("parts", [[], ["p2p", "gpu"], ["p2p,ddp"]])
def test_parts_must_be_known(bench: Any, parts: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        bench.main(["--parts", *parts])
    said = capsys.readouterr().err
    assert done.value.code == 2 and "--parts" in said and not bench.ran, said


def test_progress_is_refused_where_no_chosen_part_prints_any(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        bench.main(["--progress", "--parts", "p2p", "ddp"])
    said = capsys.readouterr().err.splitlines()[-1]
    assert done.value.code == 2 and not bench.ran
    assert said.endswith(
        "--progress applies to the parts loopback, device_executor, device_packets, device_tuning, "
        "device_profile "
        "(the others print none)"
    )
    bench.main(["--progress", "--parts", "p2p", "loopback"])
    assert bench.ran == ["p2p", "loopback"]


def test_parts_given_twice_run_once(bench: Any) -> None:
    bench.main(["--parts", "loopback", "loopback"])
    assert bench.ran == ["loopback"]


@pytest.mark.parametrize("option", [[], ["--progress"]])
def test_progress_goes_to_a_terminal_or_a_log_when_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], option: list[str]
) -> None:
    """It went to stderr always: into a pipe too, which gets the tables alone."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    monkeypatch.setitem(sys.modules, "cupy", types.SimpleNamespace())
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())

    def measure(cupy: Any, progress: Any) -> list[Any]:
        progress("setting 1 done")
        return []

    args = argparse.Namespace(progress=bool(option))
    assert bench_gpu._on_cupy(args, "part", "Part", measure, lambda rows: "table") == []
    captured = capsys.readouterr()  # stderr is no terminal here
    assert captured.err == ("  setting 1 done\n" if option else "") and "table" in captured.out


def test_a_table_without_a_bare_pair_prints_no_pair_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    times = {"4096|0.0|stragglar paper, CuPy/NCCL graph": 0.0012, "4096|0.0|CuPy/NCCL allReduce": 0.0005}
    table = bench_gpu.p2p_table(times, 4)
    assert "| 4 KiB | 0 | stragglar paper, CuPy/NCCL graph | 1.200 |" in table
    assert "pair" not in table


def test_a_graphed_round_is_compared_with_the_bare_pair_in_one_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """4 ranks, paper: 6 rounds; 24 ms with graphs is 4 ms a round, 0.8x a pair of 5 ms (a first
    version divided microseconds by seconds: 800000x)."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import bench_gpu

    times = {
        "4096|0.0|stragglar paper, eager": 0.030,
        "4096|0.0|stragglar paper, graph": 0.024,
        "4096|0.0|NCCL all_reduce": 0.027,
        "pair": 0.005,
    }
    table = bench_gpu.p2p_table(times, 4)
    assert "| 4 KiB | 0 | stragglar paper, graph | 24.000 | 4000.0 |" in table
    assert table.endswith("a StragglAR round with graphs: 0.80x the pair (target <= 1.5x: met)"), table
    times["pair"] = 0.002
    assert bench_gpu.p2p_table(times, 4).endswith("2.00x the pair (target <= 1.5x: MISSED)")


def test_the_json_is_saved_after_each_part(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A run cut short (a timeout, Ctrl-C) keeps the parts it finished."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import json

    import bench_gpu

    path = tmp_path / "gpu.json"
    bench_gpu._save_so_far(None, {"p2p": {"pair": 1e-5}}, "Test GPU")
    assert not path.exists()
    bench_gpu._save_so_far(path, {"p2p": {"pair": 1e-5}}, "Test GPU")
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["complete"] is False and doc["device"] == "Test GPU" and doc["p2p"] == {"pair": 1e-5}


def test_a_run_cut_short_keeps_its_parts_for_the_next_run_on_the_same_device(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A step of the GPU check killed by its time limit in its second part left "device": null,
    and the next step's --parts run dropped every part before it as another device's."""
    import json

    path = tmp_path / "gpu.json"

    def cut_short(args: Any, gpus: int) -> Any:
        raise KeyboardInterrupt  # as a time limit's signal would, after loopback was saved

    bench.RUNNERS["device_executor"] = cut_short
    with pytest.raises(KeyboardInterrupt):
        bench.main(["--parts", "loopback", "device_executor", "--json", str(path)])
    cut = json.loads(path.read_text(encoding="utf-8"))
    assert cut["device"] == "Test GPU" and cut["complete"] is False and "loopback" in cut
    bench.main(["--parts", "device_tuning", "--json", str(path)])
    doc = json.loads(path.read_text(encoding="utf-8"))
    assert doc["loopback"] == cut["loopback"] and doc["device_tuning"] == {"figure": "device_tuning on 1"}
    assert "not kept from" not in capsys.readouterr().out


def test_the_driver_names_the_device_without_cuda_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import subprocess

    import bench_gpu

    said: dict[str, Any] = {}

    def smi(command: list[str], **kwargs: Any) -> Any:
        said["command"] = command
        return subprocess.CompletedProcess(command, said.get("rc", 0), said.get("out", "NVIDIA H200\n"), "")

    monkeypatch.setattr(subprocess, "run", smi)
    assert bench_gpu.driver_device_name() == "NVIDIA H200" and said["command"][0] == "nvidia-smi"
    assert bench_gpu.device_name("NVIDIA H200") == "NVIDIA H200"
    said["rc"] = 9
    assert bench_gpu.driver_device_name() is None
    said.update(rc=0, out="\n")
    assert bench_gpu.driver_device_name() is None

    def missing(command: list[str], **kwargs: Any) -> Any:
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert bench_gpu.driver_device_name() is None


def test_the_gpu_check_refuses_a_step_it_does_not_have_before_it_runs_anything(tmp_path: Path) -> None:
    """A step named wrong would otherwise be skipped without a word, and the check pass."""
    script = BENCHMARKS / "gpu_check.sh"
    done = subprocess.run(
        ["bash", str(script), "device", "tunings"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "GPU_CHECK_DIR": str(tmp_path / "out")},
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("gpu_check.sh: no step 'tunings' (steps: tests device-tests loopback")
    assert not (tmp_path / "out").exists()  # nothing written, nothing run
