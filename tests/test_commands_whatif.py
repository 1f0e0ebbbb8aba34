"""``stragglar whatif``: a trace's groups, their stragglers and the predicted savings, printed and
saved; bad input one line and exit 2; it runs without torch."""

from __future__ import annotations

import json
import math
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from torch_hidden import HIDE_TORCH

from stragglar.cli import cli
from stragglar.model.detect import Rule

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
    for step in range(20):
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
    assert "group 'a': 4 ranks, 20 steps" in result.output and "group 'b': 4 ranks, 20 steps" in result.output
    # N = 4: each step adds ln 3 to the late rank's score, which names it at ln(4 / 1e-4): the 10th
    # step (step 9, counted from 0); the auto policy sees it two steps later
    said = (
        "persistent straggler: rank {}, from step 0 (named at step 9); it was last at 20 of 20 steps (100%)"
    )
    assert said.format(1) in result.output and said.format(3) in result.output
    assert (
        "rank 1 at the steps it was last: later than the next-latest rank by 20 ms (median)" in result.output
    )
    document = json.loads(out.read_text())
    a, b = document["groups"]
    assert (a["group"], a["persistent_straggler"], b["group"], b["persistent_straggler"]) == ("a", 1, "b", 3)
    assert a["persistent_stragglers"] == [{"rank": 1, "since": 0, "named": 9, "until": None}]
    assert a["decisions"] == [[0, "allreduce", None, None], [11, "stragglar", 1, None]]
    assert b["decisions"] == [[0, "allreduce", None, None], [11, "stragglar", 3, None]]
    assert a["auto_stragglar_steps"] == 9 and len(a["per_step"]) == 20
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
    assert "group '0': 4 ranks, 30 steps\n  persistent straggler: rank 2, from step 3" in shown
    assert "group '1': 4 ranks, 30 steps\n  no persistent straggler: rank 0 was last at 9 of 30" in shown


def test_json_to_standard_output_is_the_document_alone(tmp_path: Path) -> None:
    result = run(str(two_groups(tmp_path)), "--group-col", "group", "--time-col", "time_us", "--json", "-")
    assert result.exit_code == 0, result.stderr
    assert [g["persistent_straggler"] for g in json.loads(result.stdout)["groups"]] == [1, 3]
    alone = run(str(two_groups(tmp_path)), "--time-col", "time_us", "--where", "group=a", "--json", "-")
    assert json.loads(alone.stdout)["groups"][0]["group"] is None  # no group column named
    assert "persistent straggler: rank 1, from step 0" in result.stderr


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
        (["--time-col", "time_us", "--group-col", ""], "has no column ''"),  # a KeyError's traceback before
        (["--size", "1MB", "--bucket", "2MB"], "--size and --bucket both give the buckets"),
        (["--where", "op"], "expected COLUMN=VALUE, got 'op'"),
        (["--size", "0"], "Invalid value for '--size': a bucket must be more than 0 bytes"),
        (
            ["--bucket", "1MB", "--bucket", "0"],
            "Invalid value for '--bucket': a bucket must be more than 0 bytes",
        ),
        (["--time-unit", "min"], "'min' is not one of"),
        (["--share", "0"], "--share"),
        (["--share", "1"], "--share"),
        (["--false-alarm", "0"], "--false-alarm"),
        (["--false-alarm", "nan"], "Invalid value for '--false-alarm': must be in (0, 1), got nan"),
        (["--share", "nan"], "Invalid value for '--share': must be in (0, 1), got nan"),
        (["--share", "inf"], "Invalid value for '--share': inf is not in the range 0<x<1."),
        (["--share", "0_5e-1"], "Invalid value for '--share': '0_5e-1' is not a valid float."),  # float()'s
        (["--false-alarm", "1_0e-3"], "Invalid value for '--false-alarm': '1_0e-3' is not a valid float."),
        (["--margin", "-1ms"], "--margin"),
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
    assert "persistent straggler: rank 2, from step 3" in done.stdout
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


def test_an_output_into_the_trace_folder_is_refused(tmp_path: Path) -> None:
    """``whatif insp --json insp/out.json`` wrote the report among the traces: every later run of
    ``whatif insp`` read it as one and failed."""
    folder = tmp_path / "traces"
    folder.mkdir()
    two_groups(folder)
    for option in ("--json", "--plot"):
        out = folder / ("out.json" if option == "--json" else "out.png")
        line = one_error(run(str(folder), "--time-col", "time_us", option, str(out)))
        assert line == (
            f"Error: Invalid value for '{option}': {out} is in the trace folder {folder}, whose every "
            "file is read as a trace: write it somewhere else"
        )
        assert not out.exists()
    done = run(
        str(folder), "--group-col", "group", "--time-col", "time_us", "--json", str(tmp_path / "o.json")
    )
    assert done.exit_code == 0, done.output


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


def random_lateness(tmp_path: Path) -> Path:
    """8 ranks, 60 steps, a random rank 40 ms late at each (the issue's case), times in ms."""
    gen = random.Random(8)
    lines = ["step,rank,time"]
    for step in range(60):
        late = gen.randrange(8)
        lines += [
            f"{step},{rank},{1000 * step + (40 if rank == late else 0) + gen.random()}" for rank in range(8)
        ]
    path = tmp_path / "random.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_random_lateness_says_there_is_no_persistent_straggler_and_what_chance_gives(tmp_path: Path) -> None:
    result = run(str(random_lateness(tmp_path)), "--time-unit", "ms", "--json", str(tmp_path / "f.json"))
    assert result.exit_code == 0, result.output
    headline = result.output.splitlines()[5]
    assert re.fullmatch(
        r"  no persistent straggler: rank \d was last at \d+ of 60 steps \(\d+%\); chance alone: 12.5%",
        headline,
    ), headline
    assert "later than the next-latest rank" not in result.output  # no lateness for a rank usually early
    assert "the auto policy chose StragglAR at 0 of 60 steps" in result.output
    (group,) = json.loads((tmp_path / "f.json").read_text())["groups"]
    assert group["persistent_straggler"] is None and group["persistent_stragglers"] == []
    assert group["auto_stragglar_steps"] == 0 and group["chance"] == 0.125


def test_a_share_no_more_than_chance_says_nobody_can_be_named(tmp_path: Path) -> None:
    """--share 20% among 4 ranks (chance 25%): being last is no evidence, so the headline says the
    test can name nobody, not that rank 1 (last at every step) is no persistent straggler."""
    lines = ["step,rank,time"] + [
        f"{s},{r},{1000 * s + (40 if r == 1 else 0)}" for s in range(30) for r in range(4)
    ]
    path = tmp_path / "four.csv"
    path.write_text("\n".join(lines) + "\n")
    result = run(str(path), "--time-unit", "ms", "--share", "0.2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[5] == (
        "  no persistent straggler can be named: --share 20% is no more than chance (25%) among 4 ranks"
    )
    assert "persistent straggler: rank 1, from step 0" in run(str(path), "--time-unit", "ms").output


def test_a_real_straggler_is_the_headline_and_chance_finds_come_after(tmp_path: Path) -> None:
    """Rank 6 persistently late for 45 steps, then rank 2 for 20 from step 80: the headline names
    rank 2 (the straggler at the end, though named at fewer steps), dated from step 80, with its
    own share of steps last, and rank 6's episode is listed after it."""
    lines = ["step,rank,time"]
    for step in range(100):
        late = 6 if 5 <= step < 50 else 2 if step >= 80 else None
        lines += [f"{step},{rank},{1000 * step + (40 if rank == late else 0)}" for rank in range(8)]
    path = tmp_path / "moves.csv"
    path.write_text("\n".join(lines) + "\n")
    result = run(str(path), "--time-unit", "ms", "--json", "-")
    assert result.exit_code == 0, result.stderr
    out = result.stderr.splitlines()
    rule = Rule()
    named = 80 + math.ceil(rule.threshold(8) / rule.evidence(8)[0]) - 1  # a last event at every step from 80
    assert out[5].startswith(f"  persistent straggler: rank 2, from step 80 (named at step {named})"), out[5]
    before = (
        r"  named persistently late before: rank 6 from step 5 \(named at step (\d+), let go at step (\d+)\)"
    )
    episode = re.fullmatch(before, out[6])
    assert episode is not None, out[6]
    assert 5 < int(episode[1]) < 50 < int(episode[2]) <= 80  # named while late, let go after it ended
    assert "it was last at 20 of 100 steps (20%); chance alone: 12.5%" in out[5]  # rank 2's share
    (group,) = json.loads(result.stdout)["groups"]
    assert group["persistent_straggler"] == group["straggler"] == 2
    assert [(e["rank"], e["since"]) for e in group["persistent_stragglers"]] == [(6, 5), (2, 80)]


def test_a_straggler_that_went_away_is_listed_under_no_persistent_straggler_at_the_end(
    tmp_path: Path,
) -> None:
    lines = ["step,rank,time"]
    for step in range(60):
        lines += [f"{step},{rank},{step + (0.04 if rank == 5 and step < 20 else 0)}" for rank in range(8)]
    path = tmp_path / "gone.csv"
    path.write_text("\n".join(lines) + "\n")
    result = run(str(path))
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    # rank 5 last at steps 0-19, nobody after (ties): named at step 5 (its sixth), let go once its score is 0
    said = "no persistent straggler at the trace's end: rank 5 was last at 20 of 60 steps (33%)"
    assert out[5] == f"  {said}; chance alone: 12.5%"
    before = r"  named persistently late before: rank 5 from step 0 \(named at step 5, let go at step (\d+)\)"
    episode = re.fullmatch(before, out[6])
    assert episode is not None and int(episode[1]) > 20, out[6]  # some steps after it was last


def test_a_trace_of_one_step_of_two_ranks_is_counted_in_the_singular(tmp_path: Path) -> None:
    """``1 group, 1 steps`` and ``stragglar in 1 chunks`` before."""
    trace = tmp_path / "one.jsonl"
    trace.write_text('{"step": 1, "rank": 0, "time": 0.0}\n{"step": 1, "rank": 1, "time": 0.01}\n')
    result = run(str(trace))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == f"trace {trace}: 1 group, 1 step, times in s"
    assert "stragglar in 1 chunk, " in result.stdout, result.stdout


def test_the_header_lists_every_bucket_given_even_two_alike() -> None:
    """Two --bucket 1MiB were priced as two buckets under a header saying "bucket 1 MiB"."""
    options = [str(EXAMPLE), *EXAMPLE_OPTIONS[:-4], *EXAMPLE_OPTIONS[-2:]]  # without its --bucket
    twice = run(*options, "--bucket", "1MiB", "--bucket", "1MiB")
    assert twice.exit_code == 0, twice.output
    assert "; buckets 1 MiB, 1 MiB\n" in twice.output
    once = run(*options, "--bucket", "1MiB")
    assert once.exit_code == 0 and "; bucket 1 MiB\n" in once.output


def late_trace(path: Path, lateness_ms: list[int], ranks: int = 4) -> Path:
    """The last rank reaches step s ``lateness_ms[s]`` after the others, who arrive 1 ms apart."""
    rows = [
        (s, r, 1000 * s + (r if r < ranks - 1 else ranks - 2 + late))
        for s, late in enumerate(lateness_ms)
        for r in range(ranks)
    ]
    path.write_text("step,rank,time\n" + "".join(f"{s},{r},{t}\n" for s, r, t in rows))
    return path


def test_the_headline_counts_the_steps_the_rule_counts(tmp_path: Path) -> None:
    """With --margin 10ms, a rank exactly 10 ms late at every step "was last at 20 of 20 steps",
    under a rule line saying last by more than 10 ms, and was (rightly) not named."""
    trace = late_trace(tmp_path / "t.csv", [10] * 20)
    result = run(str(trace), "--time-unit", "ms", "--margin", "10ms")
    assert result.exit_code == 0, result.output
    assert (
        "no persistent straggler: rank 3 was last by more than 10 ms at 0 of 20 steps (0%)" in result.output
    )
    named = run(str(trace), "--time-unit", "ms", "--margin", "9ms")
    assert "persistent straggler: rank 3, from step 0" in named.output, named.output


def test_a_trace_too_short_to_name_anyone_says_so(tmp_path: Path) -> None:
    """3 ranks need 12 steps of one rank last to name it: 11 said "no persistent straggler" alone."""
    short = run(str(late_trace(tmp_path / "t.csv", [5] * 11, ranks=3)), "--time-unit", "ms")
    assert (
        "was last at 11 of 11 steps (100%); chance alone: 33.3%; 11 steps are too few: the rule "
        in short.output
    )
    assert "names a rank after 12 at the least" in short.output
    enough = run(str(late_trace(tmp_path / "u.csv", [5] * 12, ranks=3)), "--time-unit", "ms")
    assert "persistent straggler: rank 2, from step 0 (named at step 11)" in enough.output, enough.output
    one = run(str(late_trace(tmp_path / "v.csv", [5], ranks=3)), "--time-unit", "ms")
    assert "; 1 step is too few: the rule names a rank after 12 at the least" in one.output, one.output


def test_the_median_lateness_is_the_median(tmp_path: Path) -> None:
    """Lateness 1..30 ms printed a median of 15 ms (the lower of the middle two)."""
    result = run(str(late_trace(tmp_path / "t.csv", list(range(1, 31)))), "--time-unit", "ms")
    assert "by 15.5 ms (median), 27 ms (90th percentile)" in result.output, result.output


def test_whole_seconds_are_no_sign_of_float32_times(tmp_path: Path) -> None:
    """Times of 29,000 whole seconds warned that every time is a float32's."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "step,rank,time\n" + "".join(f"{s},{r},{29000 + 10 * s + r}\n" for s in range(30) for r in range(3))
    )
    result = run(str(trace))
    assert result.exit_code == 0 and "float32" not in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("column", "unit", "warned"),
    [("start_ms", None, "ms"), ("start_ms", "ms", None), ("t-US", None, "us"), ("items", None, None)],
)
def test_a_time_column_whose_name_says_its_unit_read_as_seconds_is_warned_of(
    tmp_path: Path, column: str, unit: str | None, warned: str | None
) -> None:
    """The bundled trace replayed without --time-unit read its start_ms as seconds: a rank 7.5 s
    late, without a word."""
    trace = tmp_path / "t.csv"
    trace.write_text(f"step,rank,{column}\n1,0,10\n1,1,17\n2,0,30\n2,1,38\n")
    args = [str(trace), "--time-col", column, *(["--time-unit", unit] if unit else [])]
    result = run(*args)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning: the time column")]
    if warned is None:
        assert warnings == []
    else:
        assert warnings == [
            f"warning: the time column '{column}' is read in seconds (--time-unit's default), and its "
            f"name says {warned}: give --time-unit {warned} if it is"
        ]
