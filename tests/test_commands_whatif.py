"""``stragglar whatif``: a trace's groups, their stragglers and the predicted savings, printed and
saved; bad input one line and exit 2; it runs without torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from torch_hidden import HIDE_TORCH

from stragglar.cli import cli

EXAMPLE = Path(__file__).parents[1] / "examples" / "traces" / "two_stages.csv"
EXAMPLE_OPTIONS = [
    *("--rank-col", "dp_rank", "--step-col", "iteration", "--time-col", "start_ms", "--time-unit", "ms"),
    *("--group-col", "stage", "--where", "op=allreduce", "--alpha", "10us", "--bandwidth", "25GB/s"),
    *("--bucket", "25MiB", "--window", "8"),
]


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, ["whatif", *args])


def one_error(result: Result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def two_groups(tmp_path: Path) -> Path:
    """Group 'a': rank 1 late by 20 ms at every step; group 'b': rank 3 late by 30 ms (in us)."""
    lines = ["group,rank,step,time_us"]
    for step in range(12):
        for group, late in (("a", 1), ("b", 3)):
            for rank in range(4):
                delay = (20_000 if group == "a" else 30_000) if rank == late else 0
                lines.append(f"{group},{rank},{step},{1_000_000 * step + delay}")
    path = tmp_path / "two.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_two_groups_with_different_stragglers_are_replayed_apart(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    result = run(
        str(two_groups(tmp_path)),
        "--group-col",
        "group",
        "--time-col",
        "time_us",
        "--time-unit",
        "us",
        "--alpha",
        "100us",
        "--bandwidth",
        "1GB/s",
        "--size",
        "12MB",
        "--json",
        str(out),
    )
    assert result.exit_code == 0, result.output
    assert "group 'a': 4 ranks, 12 steps" in result.output and "group 'b': 4 ranks, 12 steps" in result.output
    assert "persistent straggler: rank 1 from step 3" in result.output
    assert "persistent straggler: rank 3 from step 3" in result.output
    document = json.loads(out.read_text())
    a, b = document["groups"]
    assert (a["group"], a["straggler"], b["group"], b["straggler"]) == ("a", 1, "b", 3)
    assert a["decisions"] == [[0, "allreduce", None, None], [5, "stragglar", 1, None]]
    assert b["decisions"] == [[0, "allreduce", None, None], [5, "stragglar", 3, None]]
    assert a["auto_stragglar_steps"] == 7 and len(a["per_step"]) == 12
    assert a["per_step"][0]["lateness"][1] == pytest.approx(0.02)
    assert a["savings"]["auto"] > 0 and document["buckets"] == [12_000_000]


def test_the_readme_example_is_real_output(monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (EXAMPLE.parents[2] / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Would StragglAR help my job?", 1)[1]
    block = re.search(r"```text\n\$ (.*?)```", section, re.DOTALL)
    assert block is not None
    lines = block[1].split("\n")
    ends = next(i for i, line in enumerate(lines) if not line.endswith("\\"))  # the command's last line
    args = " ".join(line.rstrip("\\") for line in lines[: ends + 1]).split()
    shown = "\n".join(lines[ends + 1 :])
    assert args[:3] == ["stragglar", "whatif", "examples/traces/two_stages.csv"]
    assert sorted(args[3:]) == sorted(EXAMPLE_OPTIONS)
    monkeypatch.chdir(EXAMPLE.parents[2])
    result = CliRunner().invoke(cli, args[1:])
    assert result.exit_code == 0, result.output
    assert result.output == shown
    assert "group '0': 4 ranks, 30 steps\n  persistent straggler: rank 2 from step 8;" in shown
    assert "group '1': 4 ranks, 30 steps\n  persistent straggler: none;" in shown


def test_json_to_standard_output_is_the_document_alone(tmp_path: Path) -> None:
    result = run(str(two_groups(tmp_path)), "--group-col", "group", "--time-col", "time_us", "--json", "-")
    assert result.exit_code == 0, result.stderr
    assert [g["straggler"] for g in json.loads(result.stdout)["groups"]] == [1, 3]
    alone = run(str(two_groups(tmp_path)), "--time-col", "time_us", "--where", "group=a", "--json", "-")
    assert json.loads(alone.stdout)["groups"][0]["group"] is None  # no group column named
    assert "persistent straggler: rank 1 from step 3" in result.stderr


def test_steps_prints_a_line_per_step_and_plot_draws(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "whatif.png"
    result = run(str(EXAMPLE), *EXAMPLE_OPTIONS, "--steps", "--plot", str(plot))
    assert result.exit_code == 0, result.output
    assert (
        sum(line.startswith("      30 ") for line in result.output.splitlines()) == 2
    )  # step 30 of each group
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--time-col", "when"], "has no column 'when'"),
        (["--size", "1MB", "--bucket", "2MB"], "--size and --bucket both give the buckets"),
        (["--where", "op"], "expected COLUMN=VALUE, got 'op'"),
        (["--size", "0"], "a bucket must be more than 0 bytes"),
        (["--time-unit", "min"], "'min' is not one of"),
        (["--share", "0"], "--share"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(tmp_path: Path, args: list[str], words: str) -> None:
    assert words in one_error(run(str(two_groups(tmp_path)), *args))


def test_a_chunk_count_stragglar_cannot_use_is_refused_though_auto_never_prices_it(tmp_path: Path) -> None:
    punctual = tmp_path / "punctual.csv"  # shorter than a window and the probe's lag: no outlook
    punctual.write_text("step,rank,time\n" + "".join(f"{s},{r},{s}\n" for s in range(5) for r in range(4)))
    assert "N - 1 = 3 chunks, got 2" in one_error(run(str(punctual), "--chunks", "2"))


def test_bad_files_are_one_line_and_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    assert "is empty: no header row" in one_error(run(str(empty)))
    odd = tmp_path / "trace.txt"
    odd.write_text("step,rank,time\n")
    assert "cannot tell the format" in one_error(run(str(odd)))
    assert "file not found" in one_error(run(str(tmp_path / "none.csv")))
    many = tmp_path / "many.csv"
    many.write_text("g,step,rank,time\n" + "".join(f"{g},1,{r},{r}\n" for g in range(7) for r in range(2)))
    assert "--plot draws at most 6 groups" in one_error(
        run(str(many), "--group-col", "g", "--plot", str(tmp_path / "p.png"))
    )


# Runs in a fresh interpreter where torch and CuPy cannot be imported.
HIDDEN = HIDE_TORCH + textwrap.dedent(
    """
    import sys

    from stragglar.cli import cli
    try:
        cli.main(["whatif", *sys.argv[1:]], prog_name="stragglar")
    finally:
        print(sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "cupy")))
    """
)


def test_whatif_runs_with_torch_hidden() -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN, str(EXAMPLE), *EXAMPLE_OPTIONS],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "persistent straggler: rank 2 from step 8" in done.stdout
    assert done.stdout.splitlines()[-1] == "[]"


def test_the_report_is_never_appended_to_its_own_trace(tmp_path: Path) -> None:
    """`stragglar whatif t.csv >> t.csv` appended the report to the trace it read."""
    trace = tmp_path / "t.csv"
    trace.write_bytes((Path(__file__).parent.parent / "examples" / "traces" / "two_stages.csv").read_bytes())
    before = trace.read_bytes()
    with trace.open("ab") as out:
        done = subprocess.run(
            [sys.executable, "-m", "stragglar", "whatif", str(trace)],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
    assert done.returncode == 2 and "standard output is the input file" in done.stderr, done.stderr
    assert trace.read_bytes() == before


def test_plot_and_json_into_one_file_are_refused_before_either_is_written(tmp_path: Path) -> None:
    """`--plot X --json X` wrote one file over the other."""
    pytest.importorskip("matplotlib")
    trace = two_groups(tmp_path)
    same = tmp_path / "figures.svg"
    assert "figures.svg is the --json file too: name two files" in one_error(
        run(str(trace), "--time-col", "time_us", "--plot", str(same), "--json", str(same))
    )
    assert not same.exists()
    link = tmp_path / "link.svg"
    link.symlink_to(same)
    same.write_text("kept")
    assert "is the --json file too" in one_error(
        run(str(trace), "--time-col", "time_us", "--plot", str(link), "--json", str(same))
    )
    assert same.read_text() == "kept"
    drawn = tmp_path / "trace.svg"  # a trace named like a plot is still the input
    drawn.write_bytes(trace.read_bytes())
    assert "is the input file" in one_error(
        run(str(drawn), "--format", "csv", "--time-col", "time_us", "--plot", str(drawn))
    )
    assert drawn.read_bytes() == trace.read_bytes()


@pytest.mark.parametrize("share", ["nan", "NaN", "inf", "-inf"])
def test_a_share_that_is_no_number_in_range_is_refused(tmp_path: Path, share: str) -> None:
    """`--share nan` was accepted and printed as "nan%"."""
    assert "--share" in one_error(run(str(two_groups(tmp_path)), "--time-col", "time_us", "--share", share))


def test_where_values_are_stripped_as_cells_are(tmp_path: Path) -> None:
    trace = tmp_path / "spaced.csv"
    trace.write_text(
        "step,rank,time,op\n"
        + "".join(f"{s},{r},{s + r / 10}, allreduce\n" for s in range(6) for r in range(2))
    )
    result = run(str(trace), "--where", "op = allreduce ", "--json", "-")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["groups"][0]["steps"] == 6
