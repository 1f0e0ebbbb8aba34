"""Several schedules timed in one run: run_benchmark with a sequence of proofs or ``chunks``, the
rotating order, ``stragglar run`` / ``bench --chunks C|auto`` and their errors."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_results import one_error, run

from stragglar.errors import InputError, ResourceError
from stragglar.formats import schedule_json as json_format
from stragglar.measure.run import BenchmarkResult, Variant, run_benchmark
from stragglar.measure.sweep import Chunked, Setting, SweepResult, sweep
from stragglar.measure.timing import turn
from stragglar.model import Network, best_chunks
from stragglar.synth import synthesize
from stragglar.units import format_ratio
from stragglar.verify import Proof, prove

MIB = 2**20
TORCH = pytest.param(
    "torch", marks=pytest.mark.skipif(not importlib.util.find_spec("torch"), reason="no torch")
)


def proofs(n: int, *chunks: int | None, ring: bool = False) -> list[Proof]:
    made = [prove(synthesize("stragglar", n, chunks=c)) for c in chunks]
    return made + ([prove(synthesize("ring", n))] if ring else [])


@pytest.mark.parametrize("entries", [1, 2, 3, 5])
def test_turn_puts_every_entry_in_every_place_once_per_cycle(entries: int) -> None:
    orders = [turn(i, entries) for i in range(entries)]
    assert all(sorted(order) == list(range(entries)) for order in orders)
    for place in range(entries):
        assert sorted(order[place] for order in orders) == list(range(entries))
    assert turn(entries, entries) == turn(0, entries)  # and again from the start


def test_run_benchmark_local_times_each_proof_in_the_same_iterations() -> None:
    n, count, delay = 4, 3 * 2**10 + 5, 0.01
    ticks: list[int] = []
    result = run_benchmark(
        "local",
        n,
        4 * count,
        "int32",
        delay,
        proof=proofs(n, 9, None, ring=True),
        iters=3,
        warmup=1,
        tick=lambda: ticks.append(1),
    )
    # after each rank's input and the expected sum, then each check of each rank's result, in every
    # run of each schedule and the baseline: the bar moves while the inputs are built, too
    assert len(ticks) == n + 1 + (1 + 3) * (3 + 1) * n
    assert [(v.name, v.chunks) for v in result.variants] == [
        ("stragglar C=9", 9),
        ("stragglar", 3),
        ("ring", 4),
    ]
    assert all(len(v.times) == 3 and min(v.times) >= delay for v in result.variants)
    assert [len(v.hidden) for v in result.variants] == [3, 3, 0]  # Ring hides nothing
    assert len(result.baseline_times) == 3 and min(result.baseline_times) >= delay
    assert result.algorithm == "stragglar C=9" and result.times == result.variants[0].times
    assert result.late_rank == 3  # the first schedule's straggler, for every entry
    lines = result.report().splitlines()
    assert lines[0].startswith(
        "stragglar C=9, stragglar (the paper's C = N-1) and ring against sum of buffers on local: 4 ranks"
    )
    assert [line.split()[0] for line in lines[1:5]] == ["stragglar", "stragglar", "ring", "sum"]
    assert lines[-3:-1] == [
        f"  stragglar C=9 over {name} (ratio of the medians) {format_ratio(v.time / result.time)}x"
        for name, v in zip(["stragglar", "ring"], result.variants[1:], strict=True)
    ]
    assert lines[-1].startswith("  note: in one process")


def test_run_benchmark_chunks_adds_the_chunked_schedule_before_the_papers() -> None:
    both = run_benchmark("local", 4, 4096, "int32", chunks=6, iters=1, warmup=0)
    assert [(v.name, v.chunks) for v in both.variants] == [("stragglar C=6", 6), ("stragglar", 3)]
    paper = run_benchmark("local", 4, 4096, "int32", chunks=3, iters=1, warmup=0)
    assert [v.name for v in paper.variants] == ["stragglar"]  # C = N-1 is the paper's: run once
    alone = run_benchmark("local", 4, 4096, "int32", proof=[], iters=2, warmup=0)
    assert alone.variants == () and len(alone.baseline_times) == 2
    assert alone.report().startswith("sum of buffers on local: 4 ranks")
    assert alone.progress_line().startswith("  N=4 4 KiB 0 ms: sum of buffers ")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"chunks": 2}, "StragglAR needs at least N - 1 = 3 chunks, got 2"),
        ({"chunks": 6, "algorithm": "ring"}, "a chunk count applies to stragglar only, not ring"),
        ({"chunks": 6, "proof": proofs(4, None)}, "a given proof has its own"),
        ({"proof": proofs(4, None) + proofs(3, None)}, "schedule is for 3 ranks, not 4"),
    ],
)
def test_run_benchmark_refuses_chunks_it_cannot_use(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        run_benchmark("local", 4, 4096, "int32", iters=1, **kwargs)  # type: ignore[arg-type]


def test_run_benchmark_torch_times_several_proofs_in_one_launch() -> None:
    pytest.importorskip("torch")
    result = run_benchmark(
        "torch",
        4,
        4 * (3 * 2**10 + 7),
        "float32",
        0.02,
        proof=proofs(4, 5, None, ring=True),
        iters=2,
        timeout=30,
    )
    assert [v.name for v in result.variants] == ["stragglar C=5", "stragglar", "ring"]
    assert all(len(v.times) == 2 and min(v.times) >= 0.02 for v in result.variants)
    assert all(h < 0.02 for v in result.variants[:2] for h in v.hidden) and result.variants[2].hidden == ()
    assert result.baseline == "gloo all_reduce" and min(result.baseline_times) >= 0.02


def test_sweep_with_chunks_adds_the_chunked_columns() -> None:
    result = sweep("local", [3, 4], [4096], [0.0], chunks=lambda n, size, delay: 5 if n == 4 else 2, iters=2)
    three, four = result.settings
    assert three.chunked is not None and four.chunked is not None
    assert (three.chunked.chunks, three.chunked.gain, three.chunked.time) == (2, 1.0, three.time)  # N-1
    assert four.chunked.chunks == 5 and four.chunked.gain_min <= four.chunked.gain <= four.chunked.gain_max
    header, _, *rows, _, note = result.table().splitlines()
    assert note.startswith("note: in one process")
    assert header.endswith(
        "| C | stragglar C (ms) | sum of buffers / stragglar C: per-iteration [min-max] "
        "| stragglar / stragglar C: per-iteration [min-max] | model: stragglar / stragglar C |"
    )
    assert [row.split(" | ")[8] for row in rows] == ["2", "5"]
    assert result.to_json()["settings"][1]["chunked"]["chunks"] == 5  # type: ignore[index]
    with pytest.raises(InputError, match="StragglAR needs at least N - 1 = 3 chunks, got 2"):
        sweep("local", [3, 4], [4096], [0.0], chunks=lambda n, size, delay: 2, iters=1)


def test_cli_run_chunks_times_the_chunked_the_paper_and_the_baseline() -> None:
    result = run("run", "--gpus", "4", "--size", "12KiB", "--dtype", "int64", "--chunks", "9", "--iters", "2")
    assert result.exit_code == 0, result.output
    head, *rows = result.stdout.splitlines()
    assert head.startswith(
        "stragglar C=9 and stragglar (the paper's C = N-1) against sum of buffers on local: "
        "4 ranks, 12 KiB int64"
    )
    names = [r.split(" ms/iter")[0].rsplit(None, 1)[0].strip() for r in rows[:3]]
    assert names == ["stragglar C=9", "stragglar", "sum of buffers"]
    assert rows[3].startswith("  speed-up of stragglar C=9 (ratio of the medians) ")
    assert rows[4].startswith("  speed-up of stragglar (ratio of the medians) ")
    assert rows[5].startswith("  stragglar C=9 over stragglar (ratio of the medians) ")
    assert result.stderr == ""


def test_cli_run_chunks_auto_says_what_the_model_chose() -> None:
    c = best_chunks(4, 32 * MIB, 1e-3)
    assert c > 3  # else the chunked schedule is the paper's and nothing is compared
    result = run(
        "run", "--gpus", "4", "--size", "32MiB", "--delay", "1ms", "--chunks", "auto", "--iters", "1"
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        f"--chunks auto: C = {c}, the cost model's fastest for 32 MiB with the straggler 1 ms late "
        "(alpha 3 us, 450 GiB/s) on the paper's network\n"
    )
    assert result.stdout.startswith(
        f"stragglar C={c} and stragglar (the paper's C = N-1) against sum of buffers on local: "
        "4 ranks, 32 MiB float32"
    )


@pytest.mark.parametrize("command", ["run", "bench"])
def test_cli_chunks_auto_prices_the_paced_links_of_link_rate_and_alpha(
    monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    """With --link-rate R, auto priced the paper's 450 GiB/s links anyway; then R with the paper's
    3 us alpha, about 300x below gloo's, so every extra chunk looked free (C = 168 ran 4x slower
    than the paper's C = 3).  Now R with the latency the user states."""
    paced = Network(1e-3, 200e6)
    c = best_chunks(4, 32 * MIB, 1e-3, paced)
    assert c not in (best_chunks(4, 32 * MIB, 1e-3), best_chunks(4, 32 * MIB, 1e-3, Network(3e-6, 200e6)))
    chosen: list[int | None] = []

    def measured(*args: object, chunks: Any = None, **kwargs: object) -> None:
        chosen.append(chunks if command == "run" else chunks(4, 32 * MIB, 1e-3))
        raise InputError("measured")

    monkeypatch.setattr(
        f"stragglar.commands.measure.{'run_benchmark' if command == 'run' else 'sweep'}", measured
    )
    # the pricing is the subject, not the library: it is priced on a machine without torch too
    monkeypatch.setattr("stragglar.commands.measure.check_backend", lambda backend: None)
    setting = [
        "--size" if command == "run" else "--sizes",
        "32MiB",
        "--delay" if command == "run" else "--delays",
        "1ms",
    ]
    paced_auto = ["--backend", "torch", "--gpus", "4", *setting, "--chunks", "auto", "--link-rate", "200MB/s"]
    unpriced = one_error(run(command, *paced_auto), 2)
    assert "--chunks auto with --link-rate needs --alpha" in unpriced and chosen == []
    result = run(command, *paced_auto, "--alpha", "1ms")
    assert chosen == [c], result.output
    if command == "run":
        assert result.stderr.startswith(
            f"--chunks auto: C = {c}, the cost model's fastest for 32 MiB with the straggler 1 ms late "
            "(alpha 1 ms, 200 MB/s) on the paced links (--link-rate, --alpha)\n"
        )
    if command == "run":  # alpha 0 is a latency like any other: it was priced as the paper's 3 us
        free = run(command, *paced_auto, "--alpha", "0")
        assert "(alpha 0 s, 200 MB/s) on the paced links" in free.stderr.splitlines()[0], free.output
    fixed = run(command, "--backend", "torch", "--gpus", "4", "--chunks", "8", "--alpha", "1ms")
    assert "--alpha does not apply" in one_error(fixed, 2)


def test_cli_bench_chunks_adds_columns_and_keeps_the_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--backend", "local", "--gpus", "3,4", "--sizes", "4KiB", "--delays", "0,1ms", "--iters", "1"]
    result = run("bench", *args, "--chunks", "5", "--json", str(out))
    assert result.exit_code == 0, result.output
    rows = [line.split(" | ") for line in result.stdout.splitlines() if re.match(r"\| \d", line)]
    assert [(row[0], row[2], row[8]) for row in rows] == [
        ("| 3", "0", "5"),
        ("| 3", "1", "5"),
        ("| 4", "0", "5"),
        ("| 4", "1", "5"),
    ]
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["baseline"] == "sum of buffers" and len(doc["settings"]) == 4
    assert [s["chunked"]["chunks"] for s in doc["settings"]] == [5] * 4
    assert all(s["ratio"] > 0 and s["time"] > 0 for s in doc["settings"])  # the paper's, as before
    plain = run("bench", *args)
    assert "stragglar C" not in plain.stdout


def test_cli_bench_chunks_auto_picks_per_setting() -> None:
    args = ["--backend", "local", "--gpus", "3", "--sizes", "4KiB,32MiB", "--delays", "1ms", "--iters", "1"]
    result = run("bench", *args, "--chunks", "auto")
    assert result.exit_code == 0, result.output
    rows = [line.split(" | ") for line in result.stdout.splitlines() if re.match(r"\| \d", line)]
    assert [int(row[8]) for row in rows] == [best_chunks(3, s, 1e-3) for s in (4096, 32 * MIB)] == [2, 5]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--gpus", "4", "--chunks", "2"], "StragglAR needs at least N - 1 = 3 chunks, got 2"),
        (
            ["run", "--gpus", "4", "-a", "ring", "--chunks", "5"],
            "--chunks does not apply: it shapes StragglAR",
        ),
        (
            ["run", "--gpus", "4", "-a", "rhd", "--chunks", "auto"],
            "--chunks does not apply: it shapes StragglAR",
        ),
        (["run", "--gpus", "4", "--chunks", "many"], "expected a whole number of chunks or auto"),
        (
            ["run", "--schedule", "{file}", "--chunks", "5"],
            "--chunks does not apply: the schedule comes from",
        ),
        (["bench", "--backend", "local", "--gpus", "3,4", "--chunks", "2"], "at least N - 1 = 3 chunks"),
        (["bench", "--backend", "local", "-a", "direct", "--chunks", "auto"], "--chunks does not apply"),
    ],
)
def test_cli_chunks_that_do_not_apply_are_one_line_errors(
    args: list[str], message: str, tmp_path: Path
) -> None:
    path = tmp_path / "s4.json"
    json_format.write(synthesize("stragglar", 4), path)
    assert message in one_error(run(*(a.replace("{file}", str(path)) for a in args)), 2)


@pytest.mark.parametrize("algorithm", ["ring", "direct", "stragglar"])
@pytest.mark.parametrize("backend", ["local", TORCH])
def test_a_delay_applies_to_the_schedule_and_the_baseline_alike(backend: str, algorithm: str) -> None:
    r = run_benchmark(backend, 3, 3 * 2**10, "int64", delay=0.08, algorithm=algorithm, iters=2, warmup=0)
    assert r.late_rank == 2  # the schedule's straggler, or the last rank for Ring
    assert min(r.times) >= 0.08 and min(r.baseline_times) >= 0.08
    # a tiny buffer: both take the delay plus a little, so neither side wins by much
    assert 0.5 < r.baseline_time / r.time < 2.0, (r.times, r.baseline_times)


def test_the_late_rank_of_a_schedule_without_straggler_can_be_chosen() -> None:
    r = run_benchmark("local", 4, 2**12, "int32", delay=0.05, algorithm="ring", straggler=1, iters=1)
    assert r.late_rank == 1 and min(r.times) >= 0.05 and "(rank 1)" in r.report()
    with pytest.raises(ValueError, match=r"straggler must be a rank in 0\.\.3, got 4"):
        run_benchmark("local", 4, 2**12, "int32", algorithm="ring", straggler=4)


@pytest.mark.parametrize("backend", ["torch", "cupy"])
def test_a_missing_engine_says_how_to_install_it_without_naming_a_host(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # as if not installed: find_spec gives None
    with pytest.raises(InputError) as info:
        run_benchmark(backend, 2, 64)
    message = str(info.value)
    assert "\n" not in message
    for host in ("://", "www.", ".org", ".com", ".io", "download."):
        assert host not in message, message
    if backend == "torch":
        for words in ("CPU-only build", "CUDA build", "install selector", "install PyTorch"):
            assert words in message, message
    else:
        for words in ("cupy-cuda12x", "cupy-cuda13x", "nvidia-smi", "CUDA version"):
            assert words in message, message


# ---------------------------------------------------------------------------- the size of a run


def never(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"work was done before the refusal: {args}")


def test_a_run_past_its_cells_is_refused_before_any_schedule_is_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """``run --backend local --gpus 2048 --size 8KiB`` had not finished after 200 s: each
    iteration moves 8.4 million transfers one slice at a time."""
    monkeypatch.setattr("stragglar.measure.run.synthesize", never)
    with pytest.raises(
        InputError, match=r"^2048 ranks x 2047 chunks: a run times schedules of at most 65,536"
    ):
        run_benchmark("local", 2048, 8192)
    with pytest.raises(InputError, match=r"^16 ranks x 8192 chunks: a run times"):
        run_benchmark("local", 16, 2**20, chunks=8192)
    with pytest.raises(InputError, match=r"^257 ranks x 257 chunks: a run times"):
        run_benchmark("local", 257, 8192, algorithm="ring")


@pytest.mark.slow
def test_a_run_of_the_largest_size_is_taken() -> None:
    """N = 256 with N - 1 chunks, the largest run, and Ring's N = 256 chunks."""
    assert run_benchmark("local", 256, 8192, iters=1, warmup=0).num_ranks == 256


def test_a_sweep_refuses_a_setting_past_the_cells_before_the_first_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("stragglar.measure.sweep.run_benchmark", never)
    with pytest.raises(InputError, match=r"^300 ranks x 299 chunks: a run times"):
        sweep("local", [4, 300], [8192], [0.0])
    with pytest.raises(InputError, match=r"^8 ranks x 9000 chunks: a run times"):
        sweep("local", [4, 8], [8192], [0.0], chunks=lambda n, size, delay: 9000 if n == 8 else None)


def test_cli_run_refuses_a_large_run_at_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_text(json_format.dumps(synthesize("stragglar", 4, chunks=20000)))
    monkeypatch.setattr("stragglar.commands.measure.proved", never)
    monkeypatch.setattr("stragglar.model.chunks.best_chunks", never)
    monkeypatch.setattr("stragglar.measure.run.synthesize", never)
    for args, message in [
        (["--gpus", "2048", "--size", "8KiB"], "2048 ranks x 2047 chunks: a run times"),
        (["--gpus", "2048", "--size", "8KiB", "--chunks", "auto"], "2048 ranks x 2047 chunks: a run times"),
        (["--schedule", str(big)], "4 ranks x 20000 chunks: a run times"),
    ]:
        assert message in one_error(run("run", "--backend", "local", *args), 2)


def test_a_sweep_refuses_a_delay_past_an_hour_before_the_first_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stragglar.measure.sweep.run_benchmark", never)
    with pytest.raises(InputError, match=r"^delay must be at most 3,600 s \(an hour\), got 7200.0 s$"):
        sweep("local", [4], [8192], [0.0, 7200.0])


# ---------------------------------------------------------------------------- the nccl backend

NO_CUDA = "the {} backend needs CUDA GPUs: torch sees none (torch.cuda.device_count() is 0)"


def gpus_seen(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    """As if torch saw ``count`` CUDA GPUs (this machine has none)."""
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--backend", "nccl", "--gpus", "4"],
        ["run", "--backend", "nccl", "--schedule", "no-such-file.json"],  # refused before it is read
        ["bench", "--backend", "nccl"],
    ],
)
def test_cli_nccl_without_cuda_is_one_line_before_any_work(
    monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    gpus_seen(monkeypatch, 0)
    monkeypatch.setattr("stragglar.measure.run.synthesize", never)
    monkeypatch.setattr("stragglar.measure.sweep.check_request", never)
    assert one_error(run(*args), 2) == f"Error: {NO_CUDA.format('nccl')}"


def test_run_benchmark_and_sweep_on_nccl_without_cuda_raise_before_any_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus_seen(monkeypatch, 0)
    monkeypatch.setattr("stragglar.measure.run.synthesize", never)
    monkeypatch.setattr("stragglar.measure.sweep.check_request", never)
    with pytest.raises(InputError) as info:
        run_benchmark("nccl", 4, 2**12)
    assert str(info.value) == NO_CUDA.format("nccl")
    with pytest.raises(InputError) as info:
        sweep("nccl", [4], [2**12], [0.0])
    assert str(info.value) == NO_CUDA.format("nccl")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--link-rate", "200MB/s"], "--link-rate does not apply: it paces the torch backend's gloo sockets"),
        (["--size", "4KiB", "--dtype", "complex64"], "--dtype"),
    ],
)
def test_cli_nccl_refuses_what_does_not_apply(
    monkeypatch: pytest.MonkeyPatch, args: list[str], message: str
) -> None:
    gpus_seen(monkeypatch, 1)
    monkeypatch.setattr("stragglar.measure.run.synthesize", never)
    assert message in one_error(run("run", "--backend", "nccl", "--gpus", "2", *args), 2)


def fake_nccl_figures(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Stand in for the forked NCCL ranks; return what the run asked them for."""
    from stragglar.measure import run_torch
    from stragglar.measure.timing import Figures, Series

    asked: dict[str, Any] = {}

    def figures(proofs: list[Proof], *args: Any, **kwargs: Any) -> Figures:
        asked.update(kwargs, num_ranks=args[0])
        iters = args[4]
        schedules = tuple(Series((2e-3,) * iters, ()) for _ in proofs)
        return Figures(schedules, f"{kwargs['engine']} all_reduce", (1e-3,) * iters)

    monkeypatch.setattr(run_torch, "torch_figures", figures)
    return asked


def test_cli_run_nccl_places_ranks_on_the_gpus_and_says_once_where_they_share_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus_seen(monkeypatch, 1)
    asked = fake_nccl_figures(monkeypatch)
    result = run("run", "--backend", "nccl", "--gpus", "4", "--size", "4KiB", "--iters", "2")
    assert result.exit_code == 0, result.output
    assert asked["engine"] == "nccl" and asked["gpus"] == 1 and asked["num_ranks"] == 4
    assert (
        "stragglar against nccl all_reduce on nccl: 4 ranks" in result.stdout
        and "nccl all_reduce" in result.stdout
    )
    assert result.stdout.count("socket transport") == 1, result.stdout
    assert "the 1 GPU here" in result.stdout and "in one process" not in result.stdout


def test_cli_nccl_ranks_with_a_gpu_each_get_no_note(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus_seen(monkeypatch, 4)
    asked = fake_nccl_figures(monkeypatch)
    result = run("run", "--backend", "nccl", "--gpus", "4", "--size", "4KiB", "--iters", "2")
    assert result.exit_code == 0, result.output
    assert asked["gpus"] == 4 and "note" not in result.stdout


def test_cli_bench_nccl_says_once_that_ranks_sharing_a_gpu_talk_over_sockets(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    gpus_seen(monkeypatch, 2)
    fake_nccl_figures(monkeypatch)
    out = tmp_path / "b.json"
    args = ["--gpus", "2,4", "--sizes", "4KiB,8KiB", "--delays", "0", "--iters", "1", "--json", str(out)]
    result = run("bench", "--backend", "nccl", *args)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("socket transport") == 1, result.stdout
    assert "the 2 GPUs here" in result.stdout and "fit" not in result.stdout  # NCCL's is not a Ring
    doc = json.loads(out.read_text(encoding="utf-8"))
    assert doc["gpus"] == 2 and doc["baseline"] == "nccl all_reduce" and doc["fits"] == {}


def test_nccl_without_torch_says_to_install_a_cuda_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # as if not installed: find_spec gives None
    with pytest.raises(InputError) as info:
        run_benchmark("nccl", 2, 64)
    assert str(info.value).startswith("the nccl backend needs torch: install a CUDA build of PyTorch")


def test_no_graphs_reaches_the_nccl_ranks_and_graphs_stay_on_by_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpus_seen(monkeypatch, 1)
    asked = fake_nccl_figures(monkeypatch)
    args = ["run", "--backend", "nccl", "--gpus", "4", "--size", "4KiB", "--iters", "1"]
    assert run(*args).exit_code == 0 and asked["graphs"] is None
    assert run(*args, "--no-graphs").exit_code == 0 and asked["graphs"] is False
    bench = ["bench", "--backend", "nccl", "--gpus", "2", "--sizes", "4KiB", "--delays", "0", "--iters", "1"]
    assert run(*bench, "--no-graphs").exit_code == 0 and asked["graphs"] is False


@pytest.mark.parametrize("backend", ["local", "torch"])
def test_graphs_apply_to_the_nccl_and_cupy_backends_only(backend: str) -> None:
    message = (
        f"--no-graphs does not apply: CUDA graphs replay the nccl and cupy backends' rounds, not {backend}'s"
    )
    assert one_error(run("run", "--backend", backend, "--gpus", "2", "--no-graphs"), 2) == f"Error: {message}"
    with pytest.raises(InputError, match=f"^graphs applies to the nccl and cupy backends, not {backend}$"):
        run_benchmark(backend, 2, 64, graphs=False)
    with pytest.raises(TypeError, match=r"^graphs must be True or False, got 'off'$"):
        run_benchmark("nccl", 2, 64, graphs="off")  # type: ignore[arg-type]


def both_libraries_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if torch and cupy were installed (this machine has no cupy)."""
    import importlib.util

    from stragglar.measure import run as run_module

    found = importlib.util.find_spec("numpy")
    monkeypatch.setattr(
        run_module, "importlib", SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: found))
    )


def test_cli_device_without_cupy_or_cuda_is_one_line_before_any_work(monkeypatch: pytest.MonkeyPatch) -> None:
    from stragglar.measure import run as run_module

    monkeypatch.setattr("stragglar.measure.run.synthesize", never)
    monkeypatch.setattr(
        run_module,
        "importlib",
        SimpleNamespace(util=SimpleNamespace(find_spec=lambda name: None if name == "cupy" else object())),
    )
    line = one_error(run("run", "--backend", "device", "--gpus", "4"), 2)
    assert line == f"Error: {run_module.HINTS['device']}"
    both_libraries_found(monkeypatch)
    gpus_seen(monkeypatch, 0)
    line = one_error(run("run", "--backend", "device", "--gpus", "4"), 2)
    assert line == f"Error: {NO_CUDA.format('device')}"  # the backend asked for, not the engine under it


def test_cli_run_device_asks_the_nccl_ranks_for_the_device_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ranks run on NCCL with the device engine; ranks sharing a GPU are told apart from the
    nccl backend's (their data goes through CUDA IPC, not sockets); graphs do not apply."""
    both_libraries_found(monkeypatch)
    gpus_seen(monkeypatch, 1)
    asked = fake_nccl_figures(monkeypatch)
    result = run("run", "--backend", "device", "--gpus", "4", "--size", "4KiB", "--iters", "2")
    assert result.exit_code == 0, result.output
    assert asked["engine"] == "nccl" and asked["on_device"] is True and asked["gpus"] == 1
    assert "through CUDA IPC" in result.stdout and "talk over NCCL's socket transport" not in result.stdout
    nccl = run("run", "--backend", "nccl", "--gpus", "4", "--size", "4KiB", "--iters", "2")
    assert asked["on_device"] is False and "talk over NCCL's socket transport" in nccl.stdout
    refused = run("run", "--backend", "device", "--gpus", "4", "--no-graphs")
    assert one_error(refused, 2).endswith(
        "--no-graphs does not apply: CUDA graphs replay the nccl and cupy backends' rounds, not device's"
    )


def test_a_run_this_host_cannot_hold_is_refused_before_anything_is_allocated(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``stragglar run --size 64GiB --gpus 4`` forked its ranks, which filled the memory together
    until the kernel's OOM killer ended one (or another program): what the run certainly holds at
    once (each rank's buffer and its copy, and the reference sum) is refused (exit 3) where it is
    more than the memory available, before any rank starts or any data is made; in a sweep before
    its first setting."""
    import stragglar.measure.memory as memory
    import stragglar.measure.run as run_module
    import stragglar.measure.sweep as sweep_module
    from stragglar.measure.run_in_process import in_process_figures

    monkeypatch.setattr(memory, "available_memory", lambda: 100 * 2**20)

    def started(*args: object, **kwargs: object) -> None:
        raise AssertionError("a run started")

    monkeypatch.setattr(run_module, "in_process_figures", started)
    monkeypatch.setattr(sweep_module, "run_benchmark", started)
    with pytest.raises(ResourceError) as refused:
        run_benchmark("local", 4, 16 * 2**20)
    assert str(refused.value) == (
        "out of memory: 4 ranks of 16 MiB (float32) need at least 160 MiB of host memory (their "
        "buffers, a copy of each and the reference sum), and 100 MiB is available: give a smaller "
        "size or fewer GPUs"
    )
    with pytest.raises(ResourceError, match=r"8 ranks of 8 MiB \(float64\) need at least 136 MiB"):
        sweep("local", [2, 8], [1024, 8 * 2**20], [0.0], dtype="float64")
    with pytest.raises(InputError, match="need 2 to"):  # a bad request is said first, as before
        run_benchmark("local", 1, 16 * 2**20)
    monkeypatch.setattr(run_module, "in_process_figures", in_process_figures)
    assert run_benchmark("local", 4, 2**20, iters=1).num_ranks == 4  # 20 MiB: it fits, and runs


@pytest.mark.parametrize(
    ("backend", "need"),
    [
        ("local", 5 * 2**30 // 2),
        ("torch", 5 * 2**30 // 2),
        ("nccl", 2**29),
        ("cupy", 2**29),
        ("device", 2**29),
    ],
)
def test_what_a_run_certainly_holds_on_the_host_by_backend(backend: str, need: int) -> None:
    """The GPU backends keep their buffers on the GPU: the host holds the reference sum."""
    from stragglar.measure.memory import host_bytes
    from stragglar.measure.run import HOST_BACKENDS

    assert host_bytes(4, 2**26, "float32", on_host=backend in HOST_BACKENDS) == need


def test_the_memory_available_is_the_least_the_host_and_its_cgroups_leave(tmp_path: Path) -> None:
    """Every memory cgroup from this process's up to the root limits it (v2 and v1), each counting
    its page cache free; a namespace's ``/`` or a path the mount does not show starts at the root."""
    from stragglar.measure.memory import available_memory

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       32000000 kB\nMemAvailable:   20000000 kB\n")
    host = 20000000 * 1024
    cgroups, root = tmp_path / "cgroup", tmp_path / "sys"

    def limit(folder: Path, names: tuple[str, str, str], cap: str, used: int, cache: int, key: str) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / names[0]).write_text(cap + "\n")
        (folder / names[1]).write_text(f"{used}\n")
        (folder / "memory.stat").write_text(f"anon 1\n{key} {cache}\nactive_file 5\n")

    def available() -> int | None:
        return available_memory(str(meminfo), str(cgroups), str(root))

    assert available() == host  # no cgroup file
    cgroups.write_text("0::/job/step\n")
    v2 = ("memory.max", "memory.current", "x")
    limit(root, v2, "max", 1, 0, "file")
    limit(root / "job", v2, str(8 * 2**30), 6 * 2**30, 2 * 2**30, "file")  # 8 - 6 + 2 of cache
    limit(root / "job" / "step", v2, "max", 3 * 2**30, 0, "file")
    assert available() == 4 * 2**30
    limit(root / "job" / "step", v2, str(5 * 2**30), 3 * 2**30, 2**30, "file")
    assert available() == 3 * 2**30  # the step's own limit, tighter than its job's
    cgroups.write_text("0::/\n")  # a cgroup namespace: its root is the container's cgroup
    limit(root, v2, str(2**30), 2**29, 0, "file")
    assert available() == 2**29
    cgroups.write_text("4:memory:/process_api/x\n2:cpu:/\n")  # v1, as this host's
    v1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "x")
    limit(root / "memory", v1, "9223372036854771712", 1, 0, "total_cache")  # v1's "no limit"
    limit(root / "memory" / "process_api" / "x", v1, str(16 * 2**30), 15 * 2**30, 2**30, "total_cache")
    assert available() == 2 * 2**30
    assert available_memory(str(tmp_path / "none"), str(tmp_path / "none"), str(root)) is None


def test_a_small_speed_up_is_printed_to_three_digits_wherever_a_report_prints_one() -> None:
    """``stragglar run`` at N = 256 on 64 KiB printed its speed-up as "0.01x", and a sweep's table
    and progress line as much: every ratio below 1 is printed to three significant digits."""
    chunked = Variant("stragglar C=510", 510, (0.6776,), (0.4152,))
    paper = Variant("stragglar", 255, (0.3388,), (0.2076,))
    ran = BenchmarkResult(
        "local", 256, "float32", 2**14, 0.0, (chunked, paper), "sum of buffers", (3.134e-3,)
    )
    assert ran.report().splitlines()[4:7] == [
        "  speed-up of stragglar C=510 (ratio of the medians) 0.00463x  (hidden phase done at 415.20 ms)",
        "  speed-up of stragglar (ratio of the medians) 0.00925x  (hidden phase done at 207.60 ms)",
        "  stragglar C=510 over stragglar (ratio of the medians) 0.500x",
    ]
    assert ran.progress_line() == "  N=256 64 KiB 0 ms: 0.00463x, 0.00925x"
    gain = Chunked(510, 0.6776, 0.00463, 0.004, 0.005, 0.5, 0.45, 0.55, 0.6)
    row = Setting(256, 2**16, 0.0, 0.3388, 3.134e-3, 0.00925, 0.0081, 0.0102, 0.0123, gain)
    table = SweepResult(
        "local", "stragglar", "sum of buffers", "float32", 1, (row,), {}, "2026-01-01", "x86_64"
    )
    assert table.table().splitlines()[2] == (
        "| 256 | 64 KiB | 0 | 338.8 | 3.1 | 0.00925x | 0.00925x [0.00810-0.0102] | 0.0123x "
        "| 510 | 677.6 | 0.00463x [0.00400-0.00500] | 0.500x [0.450-0.550] | 0.600x |"
    )


def test_a_report_s_rows_give_their_rates_in_one_unit() -> None:
    """1 MiB in 13.5 ms (77.7 MB/s) beside 1 MiB in 9.9 ms (0.106 GB/s) read as if the first
    were the faster: every row now takes the slowest row's unit."""
    variant = Variant("stragglar", 3, (0.0135,), ())
    result = BenchmarkResult("torch", 4, "float32", 2**18, 0.005, (variant,), "gloo all_reduce", (0.0099,))
    rows = result.report().splitlines()[1:3]
    assert [row.split()[-1] for row in rows] == ["MB/s", "MB/s"], rows
    assert [float(row.split()[-2]) for row in rows] == [77.672, 105.917], rows
    fast = BenchmarkResult("torch", 4, "float32", 2**28, 0.0, (variant,), "gloo all_reduce", (0.0099,))
    assert [row.split()[-1] for row in fast.report().splitlines()[1:3]] == ["GB/s", "GB/s"]
