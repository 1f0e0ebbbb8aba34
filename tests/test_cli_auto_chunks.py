"""``synth --chunks auto`` for an executor's file picks among the counts the format takes, and says
so; what no count changes is refused before a count is priced or printed; a count too many for the
format gets advice a command-line user can act on; ``show --size`` names the nearest usable size
on either side of a plan's window too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_results import one_error, run

from stragglar import msccl
from stragglar.artifacts import MSCCL, MSCCLPP, ExportOptions
from stragglar.commands import options, schedules
from stragglar.errors import InputError
from stragglar.model import AUTO, PAPER_NETWORK, Network, resolve_chunks
from stragglar.msccl import MscclExportError
from stragglar.synth import synthesize
from stragglar.units import format_bytes, parse_size
from stragglar.verify import Proof, prove

GIB = 2**30


def accepted(fmt: Any, num_gpus: int, chunks: int) -> bool:
    """Whether ``fmt``'s lowering takes StragglAR over ``num_gpus`` GPUs in ``chunks`` chunks."""
    try:
        fmt.lower(prove(synthesize("stragglar", num_gpus, chunks=chunks)), ExportOptions())
    except InputError:
        return False
    return True


@pytest.mark.parametrize(
    ("num_gpus", "size", "delay", "network"),
    [
        (4, 16 * GIB, 0.05, PAPER_NETWORK),
        (8, GIB, 0.005, PAPER_NETWORK),
        (16, 64 * GIB, 0.0, Network(10e-6, 100e9)),
        (4, GIB, 0.0, Network(0.0, PAPER_NETWORK.bandwidth)),
    ],
)
def test_the_price_order_starts_with_the_cost_models_pick(
    num_gpus: int, size: int, delay: float, network: Network
) -> None:
    order = options.chunks_by_price(num_gpus, size, delay, network)
    assert order[0] == resolve_chunks(AUTO, num_gpus, size, delay, network, power_of_two=True)
    assert sorted(order) == sorted(set(order)) and all(c & (c - 1) == 0 for c in order)


def test_auto_for_a_plan_is_the_fastest_count_the_plan_takes(tmp_path: Path) -> None:
    """The cost model prices C = 128 fastest at 16 GiB and 50 ms, and an MSCCL++ plan cannot hold
    128 chunks over 4 GPUs: auto said C = 128 and failed; it takes 64 and says why not 128."""
    plan = tmp_path / "p.json"
    args = ["--gpus", "4", "--size", "16GiB", "--delay", "50ms", "--chunks", "auto", "--format", "mscclpp"]
    result = run("synth", *args, "-o", str(plan))
    assert result.exit_code == 0, result.output
    note = result.stderr.strip()
    assert note == (
        "--chunks auto: C = 64, the cost model's fastest for 16 GiB with the straggler 50 ms late "
        "(alpha 3 us, 450 GiB/s) among the powers of two an MSCCL++ plan takes (it refuses 128)"
    )
    assert json.loads(plan.read_text(encoding="utf-8"))["name"] == "stragglar-n4-s3-c64"
    assert run("verify", str(plan)).exit_code == 0
    # The note is true: every count priced faster is refused, and 64 is taken.
    order = options.chunks_by_price(4, 16 * GIB, 0.05, PAPER_NETWORK)
    faster = order[: order.index(64)]
    assert faster == [128] and not accepted(MSCCLPP, 4, 128) and accepted(MSCCLPP, 4, 64)


def refusing_more_than(limit: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """MSCCL XML's lowering, refusing more than ``limit`` chunks at once (its real refusals take
    minutes to reach); returns the counts it was asked to lower."""
    asked: list[int] = []
    lower = msccl.lower

    def lowering(proof: Proof, xml_options: Any = None) -> str:
        asked.append(proof.num_chunks)
        if proof.num_chunks > limit:
            raise MscclExportError(f"needs {proof.num_chunks} steps, the executor allows {limit}")
        return lower(proof, xml_options)

    monkeypatch.setattr("stragglar.msccl.lower", lowering)
    return asked


def test_auto_passes_over_every_count_the_format_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = refusing_more_than(16, monkeypatch)
    out = tmp_path / "x.xml"
    result = run("synth", "--gpus", "8", "--chunks", "auto", "-o", str(out))
    assert result.exit_code == 0, result.output
    order = options.chunks_by_price(8, GIB, 0.0, PAPER_NETWORK)
    fastest_taken = next(c for c in order if c <= 16)
    tried = order[: order.index(fastest_taken) + 1]
    # fastest first, none taken twice; a count over the format's cells refused before its lowering
    assert asked == [c for c in tried if c <= MSCCL.max_chunks(8, ExportOptions())]
    refused = sorted(c for c in tried if c > 16)
    assert result.stderr.strip() == (
        f"--chunks auto: C = {fastest_taken}, the cost model's fastest for 1 GiB with the straggler 0 s late "
        "(alpha 3 us, 450 GiB/s) among the powers of two MSCCL XML takes (it refuses "
        f"{', '.join(map(str, refused[:-1]))} and {refused[-1]})"
    )
    assert f'nchunksperloop="{fastest_taken}"' in out.read_text(encoding="utf-8")


def test_auto_goes_below_the_priced_counts_when_the_format_refuses_them_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 8 GPUs and 1 GiB the cost model prices 8 behind every power of two to 512: with all of
    them refused, 8 (the least power of two at N - 1 = 7) is still a count the format may take."""
    asked = refusing_more_than(8, monkeypatch)
    result = run("synth", "--gpus", "8", "--chunks", "auto", "-o", str(tmp_path / "x.xml"))
    assert result.exit_code == 0, result.output
    assert sorted(asked) == [8, 16, 32, 64, 128, 256, 512]
    assert "--chunks auto: C = 8, " in result.stderr
    assert "(it refuses 16, 32, 64, 128, 256 and 512)" in result.stderr


def test_auto_says_so_in_one_line_when_the_format_takes_no_count(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    refusing_more_than(4, monkeypatch)
    out = tmp_path / "x.xml"
    line = one_error(run("synth", "--gpus", "8", "--chunks", "auto", "-o", str(out)), 2)
    assert line == (
        "Error: --chunks auto: MSCCL XML takes no power-of-two chunk count from 8 to 4096 for 8 GPUs; "
        "with 8: needs 8 steps, the executor allows 4"
    )
    assert not out.exists()


def test_auto_names_the_faster_counts_over_the_formats_cells_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counts over the format's cells (MSCCL XML: 16,384 over 8 GPUs is 2048 chunks) were left out
    before pricing: at alpha 0, where the most chunks are fastest, auto said "the cost model's
    fastest" of a count while 4096, faster, went unnamed.  It is named now, and never lowered."""
    asked = refusing_more_than(64, monkeypatch)
    out = tmp_path / "x.xml"
    result = run("synth", "--gpus", "8", "--alpha", "0", "--chunks", "auto", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert asked == [2048, 1024, 512, 256, 128, 64]
    assert result.stderr.strip() == (
        "--chunks auto: C = 64, the cost model's fastest for 1 GiB with the straggler 0 s late "
        "(alpha 0 s, 450 GiB/s) among the powers of two MSCCL XML takes (it refuses 128, 256, 512, "
        "1024, 2048 and 4096)"
    )


def test_auto_for_a_file_of_a_small_buffer_takes_the_fewest_power_of_two(tmp_path: Path) -> None:
    """Below 4 KiB a chunk, auto takes N - 1 chunks, the fewest; for a file it refused, "no
    power-of-two chunk count from 7 to 7", where the fewest power of two, 8, fits."""
    out = tmp_path / "p.json"
    result = run(
        "synth", "--gpus", "8", "--size", "4KiB", "--chunks", "auto", "--format", "mscclpp", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("--chunks auto: C = 8, ")
    assert run("verify", str(out)).exit_code == 0


def test_auto_names_an_option_every_count_fails_on_as_it_is(tmp_path: Path) -> None:
    """A name the plan cannot have fails every count alike: that is the error, not the counts."""
    out = tmp_path / "p.json"
    line = one_error(
        run("synth", "--gpus", "4", "--chunks", "auto", "--format", "mscclpp", "--name", "", "-o", str(out)),
        2,
    )
    assert line == "Error: name must be 1 to 128 printable characters, got ''"


@pytest.mark.slow  # 8 s: the 1024 chunks it settles on are lowered and proved
def test_auto_for_msccl_on_a_network_without_latency(tmp_path: Path) -> None:
    """alpha = 0 prices the most chunks fastest, 4096, which MSCCL XML cannot hold over 4 GPUs (nor
    2048): auto said C = 4096 and failed after two minutes, then took two minutes to refuse them;
    their elements are now counted before the lowering's splits."""
    out = tmp_path / "x.xml"
    result = run(
        "synth", "--gpus", "4", "--alpha", "0", "--chunks", "auto", "--format", "msccl", "-o", str(out)
    )
    assert result.exit_code == 0, result.output
    assert "--chunks auto: C = 1024, " in result.stderr
    assert "among the powers of two MSCCL XML takes (it refuses 2048 and 4096)" in result.stderr
    assert run("verify", str(out)).exit_code == 0


def priced_never(monkeypatch: pytest.MonkeyPatch) -> None:
    def pricing(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a chunk count was priced")

    monkeypatch.setattr(schedules, "chosen_chunks", pricing)
    monkeypatch.setattr(schedules, "chunks_by_price", pricing, raising=False)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--method", "smt"],
            "Error: --chunks auto does not apply: method smt finds schedules with the paper's N - 1 chunks",
        ),
        (["--method", "smt", "--format", "mscclpp", "-o", "p.json"], "Error: --chunks auto does not apply"),
        (["--straggler", "9"], "Error: straggler must be a rank in 0..3, got 9"),
        (
            ["--straggler", "9", "--format", "mscclpp", "-o", "p.json"],
            "Error: straggler must be a rank in 0..3",
        ),
        (["--method", "smt", "--timeout", "5s"], "Error: --chunks auto does not apply"),
    ],
)
def test_what_no_count_changes_is_refused_before_auto_prices_or_prints(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], message: str
) -> None:
    """``--method smt --chunks auto`` printed auto's decision, C = 27, then refused the pair."""
    priced_never(monkeypatch)
    monkeypatch.chdir(tmp_path)
    line = one_error(run("synth", "--gpus", "4", "--chunks", "auto", *args), 2)
    assert line.startswith(message), line
    assert not (tmp_path / "p.json").exists()


def test_too_many_chunks_for_a_plan_names_the_way_out_on_the_command_line() -> None:
    line = one_error(run("synth", "--gpus", "4", "--chunks", "128", "--format", "mscclpp", "-o", "-"), 2)
    assert line.startswith("Error: round 0 of GPU 0 needs more than 64 ops"), line
    assert line.endswith(
        "; fewer than 128 chunks fit (N - 1 = 3 does): give a smaller --chunks, or --chunks auto for "
        "the fastest count an MSCCL++ plan takes"
    )
    assert accepted(MSCCLPP, 4, 3)


def test_no_chunk_advice_where_fewer_chunks_would_not_help() -> None:
    """A name the plan cannot have fails at N - 1 chunks too: fewer chunks are no way out."""
    line = one_error(
        run("synth", "--gpus", "4", "--chunks", "128", "--format", "mscclpp", "--name", "", "-o", "-"), 2
    )
    assert line == "Error: name must be 1 to 128 printable characters, got ''"


@pytest.fixture
def windowed(tmp_path: Path) -> Path:
    """The paper's plan over 4 GPUs used for 1 KiB to 1 MiB: multiples of 48 from 1056 to 1048560."""
    schedule, plan = tmp_path / "s4.json", tmp_path / "w.json"
    assert run("synth", "--gpus", "4", "-o", str(schedule)).exit_code == 0
    made = run("export", str(schedule), "--format", "mscclpp", "--min-bytes", "1KiB", "--max-bytes", "1MiB")
    assert made.exit_code == 0, made.output
    plan.write_text(made.stdout, encoding="utf-8")
    return plan


@pytest.mark.parametrize(
    ("size", "line"),
    [
        ("2MiB", "2 MiB: not used: 2097152 bytes is above max_message_size 1048576; nearest usable: 1048560"),
        ("96B", "96 B: not used: 96 bytes is below min_message_size 1024; nearest usable: 1056"),
        (
            "100B",
            "100 B: not used: 100 bytes is not a multiple of 48 (16-byte alignment x 3 chunks); "
            "nearest usable: 1056",
        ),
        (
            "1056B",
            "1.056 KB: used: 1056 bytes is a multiple of 48 (16-byte alignment x 3 chunks) within "
            "[1024, 1048576]",
        ),
    ],
)
def test_show_size_outside_the_window_names_the_nearest_usable_size(
    windowed: Path, size: str, line: str
) -> None:
    result = run("show", str(windowed), "--size", size)
    assert result.exit_code == 0, result.output
    last = result.stdout.splitlines()[-1]
    assert last == line
    assert last.count("nearest usable") <= 1
    if "nearest usable: " in last:  # each size named is one the plan is used for
        for named in last.split("nearest usable: ")[1].split(" or "):
            used = run("show", str(windowed), "--size", named).stdout.splitlines()[-1]
            assert used.startswith(f"{named_size(named)}: used: {named} bytes"), used


def named_size(text: str) -> str:
    """How ``show`` echoes a size given in bytes."""
    return format_bytes(parse_size(text))


@pytest.mark.parametrize(
    ("args", "window"),
    [
        (["--format", "mscclpp", "--max-bytes", "1MiB", "--size", "1GiB"], "--max-bytes 1 MiB"),
        (["--format", "mscclpp", "--max-bytes", "1MiB"], "--max-bytes 1 MiB"),  # the default --size
        (["--min-bytes", "2MiB", "--size", "1MiB"], "--min-bytes 2 MiB"),
    ],
)
def test_auto_refuses_to_price_a_size_the_file_is_not_for(
    tmp_path: Path, args: list[str], window: str
) -> None:
    """C = 32 was priced for 1 GiB in a plan the executor runs on buffers of at most 1 MiB."""
    out = tmp_path / ("p.json" if "mscclpp" in args else "x.xml")
    said = one_error(run("synth", "--gpus", "8", "--chunks", "auto", *args, "-o", str(out)), 2)
    assert f"is not a size the file is for ({window}): give a --size the executor will run it on" in said
    assert not out.exists()
    inside = run("synth", "--gpus", "8", "--chunks", "auto", "--size", "512KiB", "--format", "mscclpp",
                 "--max-bytes", "1MiB", "-o", str(tmp_path / "ok.json"))  # fmt: skip
    assert inside.exit_code == 0, inside.stderr
