"""What reaches the terminal between a command's steps: a bar waits for the first second of its
command, not of its own step, and no step spends its time in one C call that keeps the bar's
thread from redrawing (the plan's JSON parsed whole)."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_results import run

from stragglar.commands import terminal
from stragglar.files import read_text
from stragglar.formats import schedule_json
from stragglar.synth import synthesize


def terminal_screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Standard error, taken for a terminal (set in the test itself: pytest sets its own standard
    error again between a fixture and the test)."""
    shown = io.StringIO()
    monkeypatch.setattr(sys, "stderr", shown)
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    return shown


def test_a_step_begun_after_the_command_s_first_second_shows_its_line_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each step waited a second of its own: 1-1.6 s of blank screen between the steps of verify,
    show and cost, after the first step's line had gone."""
    screen = terminal_screen(monkeypatch)
    with terminal.command_clock(time.monotonic() - 5.0), terminal.busy("proving"):  # 5 s into it
        pass
    assert "proving: 00:00" in screen.getvalue()


def test_a_quick_command_still_shows_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = terminal_screen(monkeypatch)
    with terminal.command_clock(), terminal.busy("proving"):
        pass
    assert screen.getvalue() == ""


def test_an_inner_clock_keeps_the_outer_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A command run inside another clock (a caller's, 2 s old) counts from the outer start."""
    screen = terminal_screen(monkeypatch)
    with terminal.command_clock(time.monotonic() - 2.0), terminal.command_clock(), terminal.busy("asking z3"):
        pass
    assert "asking z3: 00:00" in screen.getvalue()


def test_a_command_s_imports_count_toward_its_first_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """The group's clock starts before the command's module is imported: a command whose imports
    took a second shows its first line at once."""
    from stragglar import cli

    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    load = cli._Entry.load

    def slow_load(entry: Any) -> Any:
        time.sleep(1.1)  # the imports of a cold disk
        return load(entry)

    monkeypatch.setattr(cli._Entry, "load", slow_load)
    monkeypatch.setitem(cli.cli.commands, "bound", cli._COMMANDS["bound"])  # not yet loaded
    result = run("bound", "--gpus", "4")
    assert result.exit_code == 0, result.output
    assert "asking z3 about 4 GPUs" in result.stderr, result.stderr  # z3 answers in a few ms


def test_verify_shows_its_proof_at_once_after_a_long_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reading's line went, and the proof's came a second later, or never for a quick one."""
    path = tmp_path / "s.json"
    schedule_json.write(synthesize("stragglar", 4), path)

    def slow(*args: Any) -> Any:
        time.sleep(1.3)  # past the command's first second
        return read_text(*args)

    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr("stragglar.commands.inputs.read_text", slow)
    result = run("verify", str(path))
    assert result.exit_code == 0 and f"proving {path}: 00:00" in result.stderr, result.stderr


def test_a_plan_is_never_parsed_whole_in_one_c_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One json.loads of the 37 MB plan of 192 GPUs held the GIL for 2.5 s inside "proving", and
    the line's thread could not redraw it: the plan is parsed a GPU at a time.  (The reading's
    parse calls a Python hook for every object, where the thread gets its turn.)"""
    plan = tmp_path / "plan.json"
    assert run("synth", "--gpus", "8", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    whole = len(plan.read_text())
    loads = json.loads
    in_c: list[int] = []

    def recorded(text: Any, **hooks: Any) -> Any:
        if not hooks.get("object_pairs_hook"):
            in_c.append(len(text))
        return loads(text, **hooks)

    monkeypatch.setattr(json, "loads", recorded)
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(terminal, "SHOW_AFTER", 0.0)  # quick work: its line from the start
    result = run("verify", str(plan))
    assert result.exit_code == 0 and f"proving {plan}" in result.stderr, result.stderr
    assert not [n for n in in_c if n >= whole // 2], in_c


def test_show_parses_a_plan_under_a_line_of_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """show read the plan of 192 GPUs, then parsed it for its three readers in 2.5 s with nothing
    on the terminal between the reading's line and the proof's."""
    plan = tmp_path / "plan.json"
    assert run("synth", "--gpus", "4", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(terminal, "SHOW_AFTER", 0.0)  # quick work: its line from the start
    result = run("show", str(plan))
    assert result.exit_code == 0 and f"parsing {plan}: 00:00" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["verify", "show"])
def test_a_plan_is_parsed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """Telling a plan from a schedule parses its JSON; the proof then parsed the text again (2.5 s
    of the 192-GPU plan's 15 s).  The format adopts the first parse: the plan reader's own parse
    never runs, and the proof and description are those of the text."""
    plan = tmp_path / "plan.json"
    assert run("synth", "--gpus", "5", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    expected = run(command, str(plan))

    def again(text: str) -> Any:
        raise AssertionError("the plan was parsed a second time")

    monkeypatch.setattr("stragglar.mscclpp.document._in_pieces", again)
    result = run(command, str(plan))
    assert result.exit_code == expected.exit_code == 0, result.stderr
    assert result.stdout == expected.stdout and "proved" in result.stdout


@pytest.mark.parametrize("command", ["verify", "show"])
def test_a_plan_holding_an_object_a_schedule_reads_as_a_transfer_is_read_as_json(
    tmp_path: Path, command: str
) -> None:
    """The parse that tells a plan from a schedule reads ``{"src", "dst", "chunk", "op"}`` as a
    schedule's transfer; a plan adopted from it said of such an op "every entry of 'ops' must be an
    object" (it is one).  Such a plan is parsed again, as JSON, and its error is the plan reader's."""
    plan = tmp_path / "plan.json"
    assert run("synth", "--gpus", "3", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    document = json.loads(plan.read_text())
    document["gpus"][0]["threadblocks"][0]["ops"][0] = {"src": 0, "dst": 1, "chunk": 0, "op": "copy"}
    plan.write_text(json.dumps(document))
    result = run(command, str(plan))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"Error: {plan} is not a plan stragglar can prove: gpu 0 tb 0 op 0: missing key 'name'"
    )
