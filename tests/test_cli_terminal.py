"""What a hostile user does to the command line, continued: what reaches the terminal (progress
lines, charts, echoed text), and how a command ends, in one ``Error:`` line with its exit code,
whatever ends it: a wrong file among many, memory, Ctrl-C, a signal, a full standard error."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_results import one_error, run, shell

from stragglar.commands import terminal
from stragglar.files import read_text, write_text
from stragglar.formats import schedule_json
from stragglar.synth import synthesize

# ---------------------------------------------------------------------------- 16. progress


def test_long_work_shows_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    quiet = run("prove-all", "--max-gpus", "3", "--max-simulated", "4")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    shown = io.StringIO()
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(sys, "stderr", shown)
    with terminal.busy("thinking", after=0.05):
        __import__("time").sleep(0.5)
    assert "thinking: 00:00" in shown.getvalue()
    assert list(terminal.progress(range(3), "counting")) == [0, 1, 2] and "counting" in shown.getvalue()


def on_screen(output: str) -> list[str]:
    """The lines a terminal shows for ``output``: a carriage return writes over its line from the start."""
    lines = []
    for raw in output.split("\n"):
        shown: list[str] = []
        for part in raw.split("\r"):
            shown[: len(part)] = part
        lines.append("".join(shown).rstrip())
    return [line for line in lines if line]


def test_prove_all_rows_never_share_a_line_with_its_bar_and_a_summary_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(terminal, "SHOW_AFTER", 0.0)  # quick work: its bar from the start
    result = run("prove-all", "--max-gpus", "3", "--max-simulated", "4")  # stdout and stderr, as a terminal
    assert result.exit_code == 0 and "proving" in result.stderr  # a bar was drawn ...
    assert on_screen(result.output) == result.stdout.splitlines()  # ... and lifted off every row
    assert (
        result.stdout.splitlines()[-1] == "proved all 11 schedules by the simulator, 7 of them by z3 as well"
    )


def test_rows_printed_before_a_bar_shows_do_not_draw_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row lifted every live bar and drew it again, a bar still in its delay too; tqdm never
    cleared a bar first drawn so, and it stayed on the summary's line: quick work shows none."""
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    result = run("prove-all", "--max-gpus", "2", "--max-simulated", "2")
    assert result.exit_code == 0 and result.stderr == "", result.stderr


def test_prove_all_counts_what_each_prover_ran_when_z3_goes_further() -> None:
    """With --max-simulated below --max-gpus the simulator proves N = 2 only (4 algorithms), z3
    every algorithm up to N = 4: the last line said all 11 by the simulator."""
    result = run("prove-all", "--max-gpus", "4", "--max-simulated", "2")
    methods = [line.split()[4] for line in result.stdout.splitlines()[1:-1]]
    assert result.exit_code == 0 and methods.count("simulate") == 4 and methods.count("smt") == 11
    assert result.stdout.splitlines()[-1] == "proved all 11 schedules: 4 by the simulator, 11 by z3"


def test_run_shows_the_time_spent_on_a_terminal_from_its_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["run", "--backend", "local", "--gpus", "3", "--size", "4KiB", "--delay", "100ms", "--iters", "8"]
    assert run(*args).stderr == ""  # silent in a pipe
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    result = run(*args)  # 1.8 s of delays: past the second after which the line shows
    assert result.exit_code == 0 and "running 3 ranks on local: 00:01" in result.stderr, result.stderr


def test_reading_and_writing_a_large_file_show_a_busy_line_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 405 MB file of N = 2048 took 16 s to write and 27 s to read, in silence."""
    path = tmp_path / "s.json"

    def slowly(work: Any) -> Any:
        def slow(*args: Any) -> Any:
            time.sleep(1.3)  # past the second after which the line shows
            return work(*args)

        return slow

    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr("stragglar.commands.outputs.write_text", slowly(write_text))
    monkeypatch.setattr("stragglar.commands.inputs.read_text", slowly(read_text))
    written = run("synth", "--gpus", "4", "-o", str(path))
    assert written.exit_code == 0 and f"writing {path}: 00:01" in written.stderr, written.stderr
    read = run("verify", str(path))
    assert read.exit_code == 0 and f"reading {path}: 00:01" in read.stderr, read.stderr


@pytest.mark.parametrize("command", ["synth --gpus 9", "export"])
def test_formatting_a_json_schedule_advances_its_bar_a_round_at_a_time(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One json.dumps of the whole schedule, a C call holding the GIL, kept the bar of N = 1024
    still for 1.9 s (N = 2048: 7 s): the text is now made a round at a time, the bar moved
    between rounds."""
    schedule = synthesize("stragglar", 9)
    source = tmp_path / "in.json"
    schedule_json.write(schedule, source)
    advanced: list[str] = []
    advance = terminal.Bar.advance

    def counted(bar: terminal.Bar, note: str = "") -> None:
        advanced.append(str(bar.bar.desc))
        advance(bar, note)

    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(terminal.Bar, "advance", counted)
    args = command.split() + ([] if command.startswith("synth") else [str(source), "--format", "json"])
    result = run(*args, "-o", str(tmp_path / "out.json"))
    assert result.exit_code == 0, result.output
    assert advanced.count("formatting the schedule as json") == schedule.num_rounds > 10
    assert (tmp_path / "out.json").read_text() == source.read_text()


def test_show_makes_its_table_under_a_busy_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """show of N = 1024 made its table for 2 s between the reading's line and the proof's, with
    nothing on the terminal."""
    path = tmp_path / "s.json"
    schedule_json.write(synthesize("stragglar", 4), path)
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(terminal, "SHOW_AFTER", 0.0)  # quick work: its line from the start
    result = run("show", str(path))
    assert result.exit_code == 0 and "formatting the schedule as text" in result.stderr, result.stderr


def test_whatif_s_replay_moves_its_clock_while_a_group_takes_its_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One group of 800,000 rows showed "replaying the groups: 0/1" for 12 s, its clock still."""
    import stragglar.commands.whatif as whatif_command

    trace = tmp_path / "t.csv"
    trace.write_text(
        "step,rank,time\n" + "".join(f"{s},{r},{s + r / 100}\n" for s in range(1, 9) for r in range(3))
    )
    replay = whatif_command._replay

    def slow(*args: Any) -> Any:
        time.sleep(1.6)  # past the second after which the bar shows
        return replay(*args)

    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(whatif_command, "_replay", slow)
    result = run("whatif", str(trace))
    assert result.exit_code == 0 and "replaying the groups: 0/1 [00:01]" in result.stderr, result.stderr


# ---------------------------------------------------------------------------- 17. prove-all


def test_prove_all_names_each_failing_file_and_ends_with_a_summary(tmp_path: Path) -> None:
    names = []
    for i in range(5):
        path = tmp_path / f"s{i}.json"
        schedule_json.write(synthesize("stragglar", 3 + i), path)
        names.append(str(path))
    (tmp_path / "s1.json").write_text("{")
    broken = schedule_json.to_document(synthesize("ring", 3))
    broken["phases"][0]["rounds"][0][0]["op"] = "copy"
    (tmp_path / "s3.json").write_text(json.dumps(broken))
    result = run("prove-all", *names)
    summary = one_error(result, 2)
    assert f"FAILED {names[1]}" in result.stdout and f"FAILED {names[3]}" in result.stdout
    assert summary.startswith("Error: 2 of 5 files failed: ") and len(summary) < 200
    verbose = run("prove-all", "-v", *names).stdout
    assert f"FAILED {names[1]}: {names[1]}: not JSON" in verbose, verbose
    assert f"FAILED {names[3]}: " in verbose, verbose


def test_prove_all_of_artifacts_keeps_its_columns_under_their_header(tmp_path: Path) -> None:
    """An artifact's name is its algorithm, and a long one pushed the rest of its row right."""
    from stragglar.release import schedule_files, write_schedule_files

    paths = write_schedule_files(tmp_path, schedule_files("stragglar", 8, chunks=32, msccl=True))
    long = schedule_json.to_document(synthesize("ring", 4))
    long["algorithm"] = "a-ring-named-at-great-length-by-whoever-wrote-this-file"
    (tmp_path / "long.json").write_text(json.dumps(long))
    result = run("prove-all", *map(str, paths), str(tmp_path / "long.json"))
    assert result.exit_code == 0, result.output
    header, *rows, summary = result.stdout.splitlines()
    column = header.index("method")
    assert {row[column:].split()[0] for row in rows} == {"smt", "simulate", "msccl", "mscclpp"}, rows
    assert summary == "proved all 4 files" and header[40:45] == "    N"  # the widest name, cut to 40
    assert rows[-1].startswith("a-ring-named-at-great-length-by-whoev... "), rows[-1]


# ---------------------------------------------------------------------------- 23. resources


def test_running_out_of_memory_is_one_line_with_its_own_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr("stragglar.commands.schedules.generate", no_memory)
    assert "out of memory" in one_error(run("synth", "--gpus", "8"), 3)


# ---------------------------------------------------------------------------- 20. plots people can read


def _boxes_overlap(a: object, b: object) -> bool:
    from matplotlib.transforms import BboxBase

    assert isinstance(a, BboxBase) and isinstance(b, BboxBase)
    return bool(a.overlaps(b))


@pytest.mark.parametrize("n", [8, 64, 128])
def test_the_schedule_chart_stays_readable_up_to_128_ranks(n: int) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from stragglar.plot import schedule_figure

    fig = schedule_figure(synthesize("stragglar", n))
    renderer = FigureCanvasAgg(fig).get_renderer()  # type: ignore[no-untyped-call]
    fig.draw(renderer)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) <= 33 and labels[-1] == f"{n - 1} (straggler)"
    title = ax.title.get_window_extent(renderer)
    phase_names = [t for extra in ax.child_axes for t in extra.get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in phase_names] == ["reduce-scatter", "exchange"]
    assert not any(_boxes_overlap(title, t.get_window_extent(renderer)) for t in phase_names)
    assert fig.bbox.contains(title.x0, title.y0) and fig.bbox.contains(title.x1, title.y1)  # not cut off


def test_the_cost_chart_keeps_its_legends_off_the_curves() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from stragglar.model import PAPER_NETWORK
    from stragglar.plot import cost_figure

    fig = cost_figure(8, 2**30, 5e-3, PAPER_NETWORK, sizes=[2, 4, 8, 16])
    renderer = FigureCanvasAgg(fig).get_renderer()  # type: ignore[no-untyped-call]
    fig.draw(renderer)
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert not _boxes_overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


def test_bench_and_run_label_their_ratios_and_count_in_words() -> None:
    ran = run("run", "--gpus", "3", "--size", "4KiB", "--iters", "1")
    assert ran.exit_code == 0 and "1 iteration (medians)" in ran.output and "4 KiB float32" in ran.output
    assert "speed-up (ratio of the medians)" in ran.output
    bench = run(
        "bench", "--backend", "local", "--gpus", "3", "--sizes", "1KiB", "--delays", "0", "--iters", "2"
    )
    assert bench.exit_code == 0
    assert "ratio of the medians | per-iteration ratio: median [min-max]" in bench.output.splitlines()[0]


# ---------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_ends_a_z3_command_in_one_line() -> None:
    """The whole command: SIGINT while ``bound`` builds or solves its model ends it at once."""
    # Python's handler restored first: a shell's background job (CI's, say) starts with SIGINT
    # ignored; "ready" once the imports are done, which take seconds on a loaded machine (a SIGINT
    # during them is Python's traceback, not the command's)
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "import sys; from stragglar.cli import main; print('ready', file=sys.stderr, flush=True); main()"
    )
    command = [sys.executable, "-c", code, "bound", "--gpus", "14"]  # z3 takes 25 s for N = 14
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stderr is not None
        assert child.stderr.readline() == "ready\n"
        time.sleep(1.5)  # into the model's building or solving
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGINT)
        start = time.perf_counter()
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert time.perf_counter() - start < 3.0
    assert child.returncode == 130 and err == "Aborted!\n" and out == "", (out, err)  # 128 + SIGINT


def pigeons(timeout_ms: int) -> Any:
    """A z3 solver of 13 pigeons in 12 holes: unsat, and minutes for z3 (11 in 10: 5 s)."""
    import z3

    holes = 12
    var = [[z3.Bool(f"p{i}_{h}") for h in range(holes)] for i in range(holes + 1)]
    solver = z3.Solver()
    solver.set("timeout", timeout_ms)
    for row in var:
        solver.add(z3.Or(row))
    for h in range(holes):
        for i in range(holes + 1):
            for j in range(i):
                solver.add(z3.Not(z3.And(var[i][h], var[j][h])))
    return solver


def test_ctrl_c_interrupts_z3_inside_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """z3's check() is one long C call, in which Python cannot run its SIGINT handler."""
    import threading

    from stragglar.commands.interrupts import ctrl_c_stops_z3

    solver = pigeons(60_000)  # without the fix the test fails after a minute, never hangs
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt), ctrl_c_stops_z3():
            solver.check()
        assert time.perf_counter() - start < 5.0
    finally:
        signal.signal(signal.SIGINT, previous)


def test_an_ignored_ctrl_c_leaves_z3_alone() -> None:
    """Where SIGINT is ignored (a background job), z3's own handler used to answer it anyway: the
    call came back "unknown" and the command said z3 ran out of time (exit 3)."""
    import threading

    import z3

    from stragglar.commands.interrupts import ctrl_c_stops_z3

    solver = pigeons(2_000)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGINT)).start()
        with ctrl_c_stops_z3():
            verdict = solver.check()
        assert verdict == z3.unknown and solver.reason_unknown() == "timeout", solver.reason_unknown()
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------------------- lone surrogates


@pytest.mark.parametrize("kind", ["schedule", "plan"])
def test_a_string_that_is_not_unicode_is_refused_when_read_not_when_printed(
    kind: str, tmp_path: Path
) -> None:
    """``"\\ud800"`` parses as JSON but cannot be printed or written: refused on reading, so
    ``export`` neither writes a file nor fails half way through its output."""
    made, bad = tmp_path / "made.json", tmp_path / "bad.json"
    assert run("synth", "--gpus", "4", "-o", str(made)).exit_code == 0
    if kind == "plan":
        plan = tmp_path / "plan.json"
        assert run("export", str(made), "--format", "mscclpp", "-o", str(plan)).exit_code == 0
        made = plan
    document = json.loads(made.read_text())
    document["name" if kind == "plan" else "algorithm"] = "late\ud800"
    bad.write_text(json.dumps(document))  # ensure_ascii: the surrogate as an escape, as a hostile file has it
    out = tmp_path / "out.json"
    for args in (
        ["show", str(bad)],
        ["verify", str(bad)],
        ["export", str(bad), "--format", "json", "-o", str(out)],
    ):
        if kind == "plan" and args[0] == "export":
            continue  # plans are not exported again
        line = one_error(run(*args), 2)
        assert line.endswith("not valid Unicode: the string 'late\\\\ud800' has half of a surrogate pair"), (
            line
        )
    assert not out.exists()
    document["name" if kind == "plan" else "algorithm"] = "late \U0001f600"  # a pair is fine
    bad.write_text(json.dumps(document))
    assert run("verify", str(bad)).exit_code == 0


# ---------------------------------------------------------------------------- what messages echo


def test_control_characters_from_a_file_are_escaped_not_sent_to_the_terminal(tmp_path: Path) -> None:
    document = schedule_json.to_document(synthesize("stragglar", 4))
    document["algorithm"] = "late\x00\x1b[2J"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    shown = run("show", str(path))
    assert shown.exit_code == 0 and "late\\x00\\x1b[2J: 4 GPUs" in shown.stdout
    assert "\x1b" not in shown.output and "\x00" not in shown.output
    escape = tmp_path / "\x1b[31m.json"
    assert "\x1b" not in one_error(run("verify", str(escape)), 2)
    exported = run("export", str(path))  # the XML name is made from the algorithm: raw ESC was in it
    assert exported.exit_code == 0 and '<algo name="late___2J-n4-s3-simple"' in exported.stdout
    assert "\x1b" not in exported.output and "\x00" not in exported.output


@pytest.mark.parametrize(
    "args",
    [
        ["synth", "--gpus", "{long}"],
        ["synth", "--gpus", "4", "--algorithm", "{long}"],
        ["cost", "--gpus", "4", "--size", "{long}"],
        ["cost", "--gpus", "4", "--delay", "1{long}"],
        ["cost", "--gpus", "4", "--size", "1{long}"],
        ["cost", "--gpus", "4", "--chunks", "{long}"],
        ["verify", "{long}"],
        ["synth", "--gpus", "4", "-o", "{long}.dat"],
        ["synth", "--gpus", "4", "-o", "{long}/x.json"],
        ["bench", "--gpus", "{long}"],
    ],
)
def test_an_error_quotes_at_most_a_few_words_of_what_it_was_given(args: list[str]) -> None:
    line = one_error(run(*(a.format(long="y" * 100_000) for a in args)), 2)
    assert "characters)" in line and len(line) < 400, line[:400]


def test_an_error_line_is_bounded_whatever_the_message_echoes_unquoted(tmp_path: Path) -> None:
    """click's "unexpected extra argument" and a JSON file's unknown key echoed 100,000 characters."""
    line = one_error(run("synth", "--gpus", "4", "z" * 100_000), 2)
    assert "z" * 50 in line and "characters)" in line and len(line) < 440, line[:500]
    document = schedule_json.to_document(synthesize("stragglar", 4))
    document["k" * 100_000] = 1
    (tmp_path / "s.json").write_text(json.dumps(document))
    line = one_error(run("verify", str(tmp_path / "s.json")), 2)
    assert line.endswith(
        "... (100,002 characters)]: unknown key (allowed: format, version, collective, "
        "algorithm, num_ranks, num_chunks, straggler, phases, metadata)"
    ), line[:500]


# ---------------------------------------------------------------------------- signals, ranks, streams


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a shell")
@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [
        (signal.SIGHUP, 129, "Error: stopped by SIGHUP: every rank was ended"),
        (signal.SIGTERM, 143, "Error: stopped by SIGTERM: every rank was ended"),
        (signal.SIGINT, 130, "Aborted!"),
    ],
)
def test_a_signal_to_run_cleans_up_and_ends_in_one_line_with_its_own_code(
    tmp_path: Path, sig: signal.Signals, code: int, line: str
) -> None:
    """A closed terminal (SIGHUP) is SIGTERM's twin: it left /tmp/stragglar-* and exited 129 silently."""
    pytest.importorskip("torch")
    code_line = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from stragglar.cli import main; main()"
    )
    args = ["run", "--backend", "torch", "-n", "2", "--size", "4", "--delay", "20ms", "--iters", "10000"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen(
        [sys.executable, "-c", code_line, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("stragglar-*")):  # the ranks' rendezvous: they are running
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        child.send_signal(sig)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == code and err.strip().splitlines() == [line] and out == "", (out, err)
    assert list(tmp_path.iterdir()) == []


def test_ranks_out_of_memory_are_a_resource_that_ran_out(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")

    def no_memory(*args: object) -> None:
        raise MemoryError

    monkeypatch.setattr("stragglar.measure.run_torch.payload", no_memory)  # the forked ranks inherit it
    line = one_error(run("run", "--backend", "torch", "-n", "2", "--size", "4", "--iters", "1"), 3)
    # both ranks raise it; under load one may see the other leave first ("lost the connection")
    assert line.startswith("Error: 2 of 2 ranks failed: ") and "raised MemoryError" in line, line


def test_a_full_standard_error_is_a_resource_that_ran_out(tmp_path: Path) -> None:
    """Its own error line could not be written: exit 1 and a traceback nobody saw, before."""
    done = shell("stragglar synth --gpus 1 2>/dev/full; echo $?", tmp_path)
    assert done.stdout.strip() == "3"


def test_stragglar_alone_prints_its_help_and_exits_0() -> None:
    result = run()
    assert result.exit_code == 0 and result.stdout.startswith("Usage: ") and result.stderr == ""
    assert "Commands:" in result.stdout


@pytest.mark.parametrize(
    "command", [["show", "{file}"], ["synth", "--gpus", "8", "--format", "json"], ["verify", "{file}"]]
)
def test_a_reader_that_went_away_ends_the_command_quietly_with_141(
    tmp_path: Path, command: list[str]
) -> None:
    """`stragglar show s.json | head -1` exited 1, which says "not a correct AllReduce"; now it
    ends as a tool killed by SIGPIPE would (128 + 13), with nothing on stderr."""
    schedule_json.write(synthesize("stragglar", 8), tmp_path / "s.json")
    reader, writer = os.pipe()
    os.close(reader)  # gone before the first byte: every write meets a closed pipe
    args = [a.format(file=tmp_path / "s.json") for a in command]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "stragglar", *args],
            stdout=writer,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(writer)
    assert done.returncode == 141 and done.stderr == "", done.stderr


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_a_reader_that_leaves_in_the_middle_of_a_document_ends_the_command_with_141(
    tmp_path: Path, fmt: str
) -> None:
    """The reader takes 10 bytes of 1.3 MB and leaves: the pipe takes part of the write, and
    Python's buffered writer dropped the rest without an error, so the command ended 0 as if the
    document had been read whole.  A reader that took it all (a small one fits in the pipe) is 0."""
    cut = shell(
        f"stragglar synth --gpus 200 --format {fmt} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}",
        tmp_path,
    )
    assert cut.stdout.strip() == "141" and cut.stderr == "", cut.stderr
    whole = shell(
        f"stragglar synth --gpus 4 --format {fmt} | head -c 10 >/dev/null; echo ${{PIPESTATUS[0]}}", tmp_path
    )
    assert whole.stdout.strip() == "0", whole.stderr


def test_a_non_blocking_standard_output_with_a_slow_reader_gets_the_whole_document(tmp_path: Path) -> None:
    """A full non-blocking pipe refuses a write for the moment (EAGAIN): the command waits for
    room, where Python's own writer gave the first 64 KiB and dropped the rest, exit 0."""
    import fcntl

    reader, writer = os.pipe()
    fcntl.fcntl(writer, fcntl.F_SETFL, fcntl.fcntl(writer, fcntl.F_GETFL) | os.O_NONBLOCK)
    try:
        command = [sys.executable, "-m", "stragglar", "synth", "--gpus", "64"]
        done = subprocess.Popen(command, stdout=writer, stderr=subprocess.PIPE)
    finally:
        os.close(writer)
    time.sleep(1.0)  # the pipe fills while nobody reads
    got = b""
    while chunk := os.read(reader, 1 << 16):
        got += chunk
    os.close(reader)
    assert done.wait(120) == 0, done.stderr.read() if done.stderr else ""
    want = subprocess.run(command, capture_output=True, timeout=120).stdout
    assert len(want) > 1 << 16 and got == want


def test_standard_output_keeps_python_s_unbuffered_mode() -> None:
    """``python -u`` (or PYTHONUNBUFFERED) writes each piece through: the stream that takes writes
    whole keeps that, so output still streams."""
    code = (
        "import sys; from stragglar.commands.error_lines import whole_writes as w; "
        "print(w(sys.stdout).write_through)"
    )
    for flags, want in ((["-u"], "True"), ([], "False")):
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        done = subprocess.run(
            [sys.executable, *flags, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        assert done.stdout.strip() == want, (flags, done.stderr)


def test_a_terminal_that_reports_no_size_still_gets_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """A terminal of size 0 x 0 gave tqdm no room, and the bar never drew: it gets 80 x 24."""
    import io

    class Terminal(io.StringIO):
        def fileno(self) -> int:
            return 2

    shown = Terminal()
    monkeypatch.setattr(sys, "stderr", shown)
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((120, 40)))
    assert terminal._screen() == (None, None)  # a size of its own: tqdm asks it
    monkeypatch.setattr(os, "get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    assert terminal._screen() == (80, 24)
    with terminal.progress_bar(4, "measuring", after=0) as bar:
        bar.advance("one")
    assert "measuring:   0%|" in shown.getvalue()  # drawn


def test_slow_steps_show_a_count_and_their_rows_as_they_come(monkeypatch: pytest.MonkeyPatch) -> None:
    """bench's bar read "1/12 [00:07<00:05, 2.00it/s]" when each setting took 7-25 s, and its
    rows came only with the table at the end: now a count and the time, and each row at once; in
    a pipe, nothing."""
    import io

    def screen(on_terminal: bool) -> str:
        shown = io.StringIO()
        monkeypatch.setattr(sys, "stderr", shown)
        monkeypatch.setattr(terminal, "_show_progress", lambda: on_terminal)
        with terminal.progress_bar(3, "measuring", after=0, slow=True) as bar:
            bar.say("  N=4 16 MiB 50 ms: 1.12x")
            bar.advance()
            bar.bar.refresh()
        return shown.getvalue()

    shown = screen(on_terminal=True)
    assert "  N=4 16 MiB 50 ms: 1.12x\n" in shown and "measuring: 1/3 [00:00]" in shown
    assert "it/s" not in shown and "<" not in shown
    assert screen(on_terminal=False) == ""
