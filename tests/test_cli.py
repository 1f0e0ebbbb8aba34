"""The ``stragglar`` command as a whole: its version, its console script and ``python -m``, one
``Error:`` line and exit 2 on bad arguments, the README's examples as real output, and options that
agree across commands.  Each command's own behaviour is tested beside its module
(``tests/test_commands_schedules.py``, ``..._model.py``, ``..._measure.py``, ``..._whatif.py``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_results import SUMMARY_8, one_error, run

from stragglar import __version__
from stragglar.cli import cli


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0
    assert result.stdout == f"stragglar {__version__}\n"


def test_installed_console_script_runs() -> None:
    script = shutil.which("stragglar", path=str(Path(sys.executable).parent)) or shutil.which("stragglar")
    assert script is not None, "the stragglar console script is not installed"
    done = subprocess.run([script, "synth", "--gpus", "8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == SUMMARY_8


def test_python_dash_m_runs_the_same_command() -> None:
    command = [sys.executable, "-m", "stragglar"]
    done = subprocess.run([*command, "synth", "--gpus", "8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == SUMMARY_8
    bad = subprocess.run([*command, "synth", "--gpus", "1"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.splitlines()[-1] == "Error: need 2 to 2048 GPUs, got 1", bad.stderr


# ---------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["synth", "--gpus", "1"], "need 2 to 2048 GPUs, got 1"),
        (["synth", "--gpus", "-4"], "need 2 to 2048 GPUs, got -4"),
        (["synth", "--gpus", "100000"], "need 2 to 2048 GPUs, got 100000"),
        (["synth", "--gpus", "0", "-o", "x.xml"], "need 2 to 2048 GPUs, got 0"),  # was a ZeroDivisionError
        (["synth", "--gpus", "0", "--format", "mscclpp", "-o", "p.json"], "need 2 to 2048 GPUs, got 0"),
        (["synth", "--gpus", "eight"], "'eight' is not a valid integer"),
        (["synth", "--gpus", "2.5"], "'2.5' is not a valid integer"),
        (["synth"], "Missing option '--gpus'"),
        (["synth", "--gpus", "8", "--straggler", "8"], "straggler must be a rank in 0..7, got 8"),
        (["synth", "--gpus", "8", "--straggler", "-1"], "straggler must be a rank in 0..7, got -1"),
        (["synth", "--gpus", "8", "--algorithm", "tree"], "'tree' is not one of"),
        (["synth", "--gpus", "6", "--algorithm", "rhd"], "rhd needs a power-of-two number of GPUs, got 6"),
        (["synth", "--gpus", "8", "--algorithm", "ring", "--straggler", "3"], "has no straggler"),
        (["synth", "--gpus", "8", "--format", "xml"], "'xml' is not one of"),
        (["synth", "--gpus", "8", "--bogus"], "No such option '--bogus'"),
        (["simulate"], "No such command 'simulate'"),
        (["verify"], "Missing argument 'FILE'"),
    ],
)
def test_bad_arguments(args: list[str], message: str) -> None:
    line = one_error(run(*args), 2)
    assert message in line


# ---------------------------------------------------------------------------- README


README = Path(__file__).resolve().parent.parent / "README.md"


def readme_sessions() -> list[tuple[str, str]]:
    """Every ``$ stragglar ...`` command in the README's console blocks, with the output shown."""
    sessions: list[tuple[str, str]] = []
    for block in re.findall(r"```console\n(.*?)```", README.read_text(encoding="utf-8"), re.DOTALL):
        for entry in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
            command, _, output = entry.partition("\n")
            sessions.append((command, output))
    return sessions


def break_s4(folder: Path) -> None:
    """The edit the README describes: the straggler's reduce in the round-2 exchange carries chunk 0."""
    doc = json.loads((folder / "s4.json").read_text(encoding="utf-8"))
    rnd = doc["phases"][1]["rounds"][2]
    rnd[rnd.index({"src": 0, "dst": 3, "chunk": 2, "op": "reduce"})]["chunk"] = 0
    (folder / "broken.json").write_text(json.dumps(doc), encoding="utf-8")


def test_readme_opens_with_the_two_commands() -> None:
    blocks = re.findall(r"```sh\n(.*?)\n```", README.read_text(encoding="utf-8"), re.DOTALL)
    assert blocks[:2] == ["pip install . && stragglar synth --gpus 8", "pip install '.[test]' && pytest"]


@pytest.mark.parametrize(
    ("command", "paragraph"),
    [("synth", "Options of `synth`:"), ("bound", "`stragglar bound --gpus N` asks z3")],
)
def test_the_readme_paragraph_on_a_command_names_every_option_it_has(command: str, paragraph: str) -> None:
    """A paragraph that lists a command's options lists all of them, and every value of a choice
    (synth's listed ``--format`` without ``mscclpp`` and left out eleven options)."""
    text = README.read_text(encoding="utf-8")
    start = text.index(paragraph)
    words = " ".join(text[start : text.index("\n\n", start)].split())
    for param in cli.commands[command].params:
        longest = max(param.opts, key=len)
        if longest == "--help":
            continue
        named = any(re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", words) for opt in param.opts)
        assert named, f"{command}'s {longest} is not in its README paragraph"
        choices = getattr(param.type, "choices", ())
        assert all(str(choice) in words for choice in choices), (longest, choices)


def test_readme_examples_are_real_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sessions = readme_sessions()
    assert [c for c, _ in sessions][:2] == [
        "stragglar synth --gpus 8",
        "stragglar synth --gpus 4 --straggler 0 -o s4.json",
    ]
    for command, shown in sessions:
        if command == "stragglar verify broken.json":
            break_s4(tmp_path)
        args = command.split()
        assert args[0] == "stragglar"
        assert run(*args[1:]).output == shown, command


def test_timeouts_agree_where_they_bound_the_same_thing_and_say_why_they_differ() -> None:
    """run 60 s, bench 120 s, synth and bound 600 s: three defaults and nothing said why."""
    defaults, helps = {}, {}
    for name in ("run", "bench", "synth", "bound"):
        command = cli.commands[name]
        option = next(p for p in command.params if p.name == "timeout")
        defaults[name], helps[name] = option.default, option.help or ""
    assert defaults == {"run": "60s", "bench": "60s", "synth": "600s", "bound": "600s"}
    assert all("each wait for a peer" in helps[name] and "600s" in helps[name] for name in ("run", "bench"))
    assert all("60s, bounds one wait for a peer" in helps[name] for name in ("synth", "bound"))


# ---------------------------------------------------------------------------- start-up

COMMANDS = ["synth", "export", "verify", "show", "cost", "bound", "prove-all", "whatif", "run", "bench"]
# What one command or another needs, and none of the light ones below: the commands' modules,
# the provers' graph and array libraries, z3, the runtime that `run` launches.
HEAVY = [
    "stragglar.commands.schedules",
    "stragglar.commands.model",
    "stragglar.commands.measure",
    "stragglar.commands.whatif",
    "stragglar.artifacts",
    "stragglar.msccl.prover",
    "stragglar.runtime",
    "networkx",
    "numpy",
    "z3",
]
IMPORTED = """
import json, sys
from stragglar.cli import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(sorted(set(HEAVY) & set(sys.modules))), file=sys.stderr)
"""


def _imported(*args: str) -> tuple[str, list[str]]:
    """What ``stragglar ARGS`` prints, and which of :data:`HEAVY` it imported, in a fresh process
    (``-c``: ``python -m`` would import ``stragglar.__main__``, which is the same)."""
    code = f"HEAVY = {HEAVY!r}\n{IMPORTED}"
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    return done.stdout, json.loads(done.stderr.splitlines()[-1])


def test_the_help_lists_every_command_and_imports_none_of_them() -> None:
    """``stragglar --help`` (and ``import stragglar.cli``) imports no command's module: the listing
    is the names and one-line helps of the group's table.  It took 0.7-1.0 s when every module,
    the provers' networkx and numpy and the runtime came first."""
    text, heavy = _imported("--help")
    assert heavy == []
    listed = text[text.index("Commands:\n") :].splitlines()[1:]
    assert [line.split()[0] for line in listed] == sorted(COMMANDS)
    assert list(cli.commands) == COMMANDS


SCHEDULES = {"stragglar.commands.schedules", "stragglar.artifacts", "stragglar.msccl.prover", "z3"}


@pytest.mark.parametrize(
    ("args", "may_import"),
    [
        (["synth", "--gpus", "8"], SCHEDULES),
        (["verify", str(README.parent / "schedules" / "json" / "stragglar-n4-s3.json")], SCHEDULES),
        (
            ["cost", "--gpus", "8"],
            {"stragglar.commands.model", *SCHEDULES - {"stragglar.commands.schedules"}},
        ),
        (
            ["whatif", "--help"],
            {"stragglar.commands.whatif", "stragglar.artifacts", "stragglar.msccl.prover"},
        ),
    ],
)
def test_a_command_imports_its_own_module_and_what_it_uses(args: list[str], may_import: set[str]) -> None:
    """A command imports its topic's module, not the others' (``run``'s runtime), and no graph or
    array library it does not use: networkx explains a deadlocked file, numpy prices chunk counts
    and follows an executor file's clocks (z3: every command but run and bench stops it on Ctrl-C)."""
    text, heavy = _imported(*args)
    assert text
    assert set(heavy) <= may_import
    assert any(m.startswith("stragglar.commands.") for m in heavy)  # its own topic's module


@pytest.mark.parametrize("name", COMMANDS)
def test_the_listed_one_line_help_is_the_commands_own(name: str) -> None:
    """The table's summary shortens as the command's own help does, at every width: ``stragglar
    --help`` and the shell's completions say what they said when every command was imported."""
    from stragglar.cli import _COMMANDS

    command, stand_in = cli.commands[name], _COMMANDS[name].stand_in(name)
    assert command.name == name and not command.hidden and not command.deprecated
    for limit in (*range(10, 400, 3), 45):
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), limit
