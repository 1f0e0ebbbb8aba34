"""``synth``, ``export``, ``verify`` and ``show`` (:mod:`stragglar.commands.schedules`): real output
on the happy paths, one ``Error:`` line with its exit code on bad input and wrong schedules, and
artifacts proved from their own text."""

from __future__ import annotations

import importlib
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cli_results import SUMMARY_8, one_error, run

from stragglar.commands import options, schedules
from stragglar.formats import schedule_json
from stragglar.formats.text import render
from stragglar.schedule import Phase, Schedule
from stragglar.synth import Request, synthesize
from stragglar.verify import prove

PROOF_8 = "proved: allreduce over 8 ranks, 7 chunks, 9 rounds after the straggler (15 in all), 98 transfers"


def phase_round_counts(table: str) -> list[int]:
    return [int(m) for m in re.findall(r"^phase \d+ .*: (\d+) rounds?$", table, re.MULTILINE)]


def test_synth_prints_the_table_then_the_summary() -> None:
    result = run("synth", "--gpus", "8")
    assert result.exit_code == 0
    *table, summary = result.stdout.splitlines()
    assert summary == SUMMARY_8
    assert phase_round_counts("\n".join(table)) == [6, 9]
    assert sum(line.startswith("  round ") for line in table) == 15
    assert "  round 0 | 0<>7 c0+" in table
    assert result.stderr == ""


def test_synth_moves_the_straggler() -> None:
    result = run("synth", "--gpus", "6", "--straggler", "0")
    assert result.exit_code == 0
    assert "phase 0 'reduce-scatter', ranks 1-5: 4 rounds" in result.stdout
    assert "  round 0 | 0<>1 c0+" in result.stdout
    assert "6 GPUs (straggler 0), 5 chunks, 7 rounds after the straggler arrives" in result.stdout
    assert "(lower bound R*(6) = 7: optimal)" in result.stdout


@pytest.mark.parametrize(
    ("algorithm", "summary"),
    [
        ("ring", "ring: 8 GPUs, 8 chunks, 14 rounds, 112 transfers; proved"),
        # halving moves several chunks over one link a round: its chunk-steps said, as prove-all does
        ("rhd", "rhd: 8 GPUs, 8 chunks, 6 rounds (14 chunk-steps), 112 transfers; proved"),
        (
            "direct",
            "direct: 8 GPUs (straggler 7), 7 chunks, 3 rounds (21 chunk-steps) after the straggler arrives",
        ),
    ],
)
def test_baselines_have_no_lower_bound_comparison(algorithm: str, summary: str) -> None:
    result = run("synth", "--gpus", "8", "--algorithm", algorithm)
    assert result.exit_code == 0
    last = result.stdout.splitlines()[-1]
    assert last.startswith(summary)
    assert "R*" not in last


def test_verbose_says_what_a_json_schedules_proof_covers(tmp_path: Path) -> None:
    """``-v`` printed for a JSON schedule only the other summary line, not what its help promises:
    what the proof covers.  Each command's verbose output now ends with it."""
    path = tmp_path / "rhd.json"
    made = run("synth", "--gpus", "8", "--algorithm", "rhd", "-o", str(path), "-v")
    checked = run("verify", str(path), "-v")
    shown = run("show", str(path), "-v")
    for result in (made, checked, shown):
        assert result.exit_code == 0, result.output
        last = result.stdout.splitlines()[-1]
        assert last.startswith("covers, by a symbolic run"), last
        assert "each rank's contribution exactly once" in last
    assert "6 rounds (14 chunk-steps)" in checked.stdout.splitlines()[0]


def test_synth_json_on_stdout_is_clean_and_the_summary_goes_to_stderr() -> None:
    result = run("synth", "--gpus", "8", "--format", "json")
    assert result.exit_code == 0
    assert schedule_json.loads(result.stdout) == synthesize("stragglar", 8)
    assert result.stderr.strip() == SUMMARY_8


def test_output_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "s8.json"
    written = run("synth", "--gpus", "8", "-o", str(path))
    assert written.exit_code == 0
    assert written.stdout.strip() == SUMMARY_8
    assert schedule_json.read(path) == synthesize("stragglar", 8)

    verified = run("verify", str(path))
    assert verified.exit_code == 0
    assert verified.stdout == f"{path}: {PROOF_8}\n"
    assert (
        run("verify", "-v", str(path)).stdout
        == f"{path}: {PROOF_8}\n{SUMMARY_8}\n{prove(synthesize('stragglar', 8)).covers}\n"
    )

    shown = run("show", str(path))
    assert shown.exit_code == 0
    assert shown.stdout == run("synth", "--gpus", "8").stdout


def test_output_file_as_text(tmp_path: Path) -> None:
    path = tmp_path / "s5.txt"
    result = run("synth", "--gpus", "5", "-o", str(path), "--format", "text")
    assert result.exit_code == 0
    text = path.read_text(encoding="utf-8")
    assert text == f"{render(synthesize('stragglar', 5))}\n{result.stdout}"
    assert "R*(5) = 6: optimal" in result.stdout


def test_unwritable_output(tmp_path: Path) -> None:
    line = one_error(run("synth", "--gpus", "4", "-o", str(tmp_path / "no" / "s.json")), 2)
    assert "'-o' / '--output'" in line and "folder" in line and "does not exist" in line
    (tmp_path / "s4.json").write_text("{}", encoding="utf-8")  # a file where a folder is named
    line = one_error(run("synth", "--gpus", "4", "-o", str(tmp_path / "s4.json" / "x.json")), 2)
    assert line.endswith(f"folder {tmp_path / 's4.json'} is not a folder")


@pytest.mark.parametrize("command", ["verify", "show"])
@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "file not found"),
        (b"", "s.json is empty"),
        (b'{"format": "stragglar-schedule", "version": 1', "not JSON"),
        (b'{"format": "stragglar-schedule", "version": 2}', "unsupported version 2"),
        (b'{"format": "stragglar-schedule", "version": 1}', "collective: missing required key"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_bad_files(tmp_path: Path, command: str, content: bytes | None, message: str) -> None:
    path = tmp_path / "s.json"
    if content is not None:
        path.write_bytes(content)
    line = one_error(run(command, str(path)), 2)
    assert message in line
    assert str(path) in line


def test_a_directory_is_not_a_schedule(tmp_path: Path) -> None:
    line = one_error(run("verify", str(tmp_path)), 2)
    assert line == f"Error: {tmp_path} is not a regular file (stragglar reads schedules from files)"


def tampered(tmp_path: Path) -> Path:
    """A well-formed file whose first reduce carries the chunk of the next one on the same link,
    so that the next round adds rank 0's contribution twice."""
    doc = schedule_json.to_document(synthesize("stragglar", 8))
    first, second = (rnd[0] for rnd in doc["phases"][0]["rounds"][:2])
    assert (first["src"], first["dst"]) == (second["src"], second["dst"]) == (0, 1)
    first["chunk"] = second["chunk"]
    path = tmp_path / "tampered.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    schedule_json.read(path)  # still well-formed: the error must be about correctness
    return path


def test_verify_rejects_a_tampered_file_naming_round_rank_and_chunk(tmp_path: Path) -> None:
    path = tampered(tmp_path)
    line = one_error(run("verify", str(path)), 1)
    assert line.startswith(f"Error: {path} is not a correct AllReduce: phase 0 'reduce-scatter' round 1: ")
    twice = r"transfer 0->1 chunk (\d+) \(reduce\) gives rank 1 contribution of rank 0 twice in chunk \1;"
    assert re.search(twice, line)


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["--chunks", "12", "--format", "json"],
        ["--chunks", "auto"],
        ["--chunks", "12", "--format", "msccl"],
        ["--chunks", "auto", "--format", "msccl"],
        ["--chunks", "auto", "--format", "mscclpp", "--instances", "2"],
    ],
)
def test_synth_checks_its_request_once(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    """The request (check_request's checks) and an export format's limits are each asked once:
    ``--chunks auto`` for a file asks the format about N before it prices chunk counts, and the
    count it then picks is within the format's limits.  (Pricing synthesizes candidates of its
    own, each checked: not the command's request.)"""
    asked: list[str] = []
    pricing: list[bool] = []
    refined, chosen = Request.refined, options.chosen_chunks

    def refining(request: Request, *rest: Any, **keywords: Any) -> Request:
        if not pricing:
            asked.append("request")
        return refined(request, *rest, **keywords)

    def choosing(*args: Any, **kwargs: Any) -> int | None:
        pricing.append(True)
        try:
            return chosen(*args, **kwargs)
        finally:
            pricing.pop()

    monkeypatch.setattr(Request, "refined", refining)
    monkeypatch.setattr(schedules, "chosen_chunks", choosing)
    for package in ("msccl", "mscclpp"):
        check = importlib.import_module(f"stragglar.{package}").check_request
        monkeypatch.setattr(f"stragglar.{package}.check_request", counted(asked, "format", check))
    result = run("synth", "--gpus", "8", *args)
    assert result.exit_code == 0, result.output
    exported = any(fmt in args for fmt in ("msccl", "mscclpp"))
    assert asked == ["format", "request"] if exported and "auto" in args else asked[:1] == ["request"]
    assert asked.count("request") == 1 and asked.count("format") == exported


def counted(asked: list[str], what: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, noting ``what`` in ``asked`` at each call."""

    def noting(*args: Any, **kwargs: Any) -> Any:
        asked.append(what)
        return function(*args, **kwargs)

    return noting


def test_synth_never_writes_a_schedule_it_cannot_prove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If a generator ever produced a wrong schedule, synth must refuse it (exit 1) and write nothing."""
    wrong = schedule_json.read(tampered(tmp_path))
    monkeypatch.setattr("stragglar.commands.schedules.generate", lambda *args, **kwargs: wrong)
    path = tmp_path / "out.json"
    line = one_error(run("synth", "--gpus", "8", "-o", str(path)), 1)
    assert line.startswith(
        "Error: the stragglar schedule is not a correct AllReduce: phase 0 'reduce-scatter' round 1"
    )
    assert not path.exists()
    printed = run("synth", "--gpus", "8")
    one_error(printed, 1)
    assert printed.stdout == ""


def test_show_prints_the_table_of_a_tampered_file_then_fails(tmp_path: Path) -> None:
    result = run("show", str(tampered(tmp_path)))
    line = one_error(result, 1)
    assert "round 1" in line
    assert phase_round_counts(result.stdout) == [6, 9]
    assert "proved" not in result.stdout


def test_show_reports_a_gap_to_the_lower_bound(tmp_path: Path) -> None:
    """A correct StragglAR schedule with an idle round at the end is proved, one round above R*."""
    s = synthesize("stragglar", 4)
    last = s.phases[-1]
    phases = (*s.phases[:-1], Phase(last.name, last.ranks, (*last.rounds, ())))
    slower = Schedule(s.algorithm, s.num_ranks, s.num_chunks, s.straggler, phases)
    path = tmp_path / "slower.json"
    schedule_json.write(slower, path)
    result = run("show", str(path))
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-2] == "  round 4 | -"
    summary = result.stdout.splitlines()[-1]
    assert (
        "5 rounds after the straggler arrives (lower bound R*(4) = 4: +1), 7 in all, 18 transfers" in summary
    )


def edited_plan(tmp_path: Path, **fields: int) -> Path:
    """Our plan for 4 GPUs with its top-level ``fields`` replaced."""
    path = tmp_path / "plan.json"
    assert run("synth", "--gpus", "4", "--format", "mscclpp", "-o", str(path)).exit_code == 0
    plan = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**plan, **fields}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("fields", "code", "message"),
    [
        ({"buffer_alignment": 3}, 2, "plan: 'buffer_alignment' must be a positive multiple of 16 below 2^32"),
        ({"max_message_size": 2**70}, 2, "plan: 'max_message_size' must be an integer from 0 to 2^64-1"),
        (
            {"min_message_size": 4096, "max_message_size": 1024},
            1,
            "plan: no buffer size selects the plan: min_message_size 4096 > max_message_size 1024",
        ),
    ],
)
@pytest.mark.parametrize("command", ["verify", "show"])
def test_plan_size_fields_the_executor_cannot_use_are_refused(
    tmp_path: Path, command: str, fields: dict[str, int], code: int, message: str
) -> None:
    """An alignment the kernel misaddresses or a size beyond 64 bits is a plan the executor cannot
    run as written (exit 2); a window no size fits is a plan it never runs (exit 1)."""
    line = one_error(run(command, str(edited_plan(tmp_path, **fields))), code)
    assert message in line


def test_show_size_names_only_sizes_the_plan_is_used_for(tmp_path: Path) -> None:
    """1 KiB lies between multiples of 48 (1008, 1056) that are both below min_message_size: the
    nearest usable size is the first multiple inside the window."""
    path = edited_plan(tmp_path, min_message_size=1100)
    result = run("show", str(path), "--size", "1KiB")
    assert result.exit_code == 0, result.output
    last = result.stdout.splitlines()[-1]
    assert last.endswith("nearest usable: 1104")
    assert last.startswith(
        "1 KiB: not used: 1024 bytes is not a multiple of 48"
    )  # the size as given, then exact
    assert (
        run("show", str(path), "--size", "1104")
        .stdout.splitlines()[-1]
        .startswith("1.104 KB: used: 1104 bytes")
    )


def test_show_size_past_every_usable_size_says_so_first(tmp_path: Path) -> None:
    """1 EiB is no multiple of the step either, but "nearest usable: <the largest>" hid why."""
    path = tmp_path / "plan.json"
    assert run("synth", "--gpus", "8", "--format", "mscclpp", "-o", str(path)).exit_code == 0
    last = run("show", str(path), "--size", "1EiB").stdout.splitlines()[-1]
    assert last.startswith("1 EiB: not used: 1152921504606846976 bytes is above max_message_size "), last


def test_synth_to_xml_then_verify_the_xml(tmp_path: Path) -> None:
    path = tmp_path / "stragglar8.xml"
    result = run("synth", "--gpus", "8", "-o", str(path))
    assert result.exit_code == 0, result.output
    assert result.output == f"{SUMMARY_8}; MSCCL XML proved: 94 thread blocks, 196 steps\n"
    assert path.read_text(encoding="utf-8").startswith('<algo name="stragglar-n8-s7-simple" proto="Simple"')
    verified = run("verify", str(path))
    assert verified.exit_code == 0
    assert verified.output.startswith(f"{path}: proved: stragglar-n8-s7-simple: in-place allreduce over 8")
    assert "no deadlock" in run("verify", "-v", str(path)).output
    shown = run("show", str(path))
    assert shown.output.startswith("stragglar-n8-s7-simple: 8 GPUs, 7 chunks per loop, 1 channel, Simple\n")


def test_export_a_json_schedule_with_options(tmp_path: Path) -> None:
    source, target = tmp_path / "r.json", tmp_path / "r.xml"
    schedule_json.write(synthesize("ring", 4), source)
    result = run(
        "export", str(source), "-o", str(target), "--proto", "LL128", "--instances", "2", "--name", "r4"
    )
    assert result.exit_code == 0, result.output
    text = target.read_text(encoding="utf-8")
    assert text.startswith('<algo name="r4" proto="LL128"') and 'nchunksperloop="8"' in text
    assert "LL128 (8 chunks per connection)" in run("verify", "-v", str(target)).output


def test_verify_rejects_a_tampered_xml_naming_gpu_tb_and_step(tmp_path: Path) -> None:
    """gpu 0 tb 1 has one step, which tb 3 waits for: without hasdep nothing ever releases it."""
    path = tmp_path / "s.xml"
    assert run("synth", "--gpus", "4", "-o", str(path)).exit_code == 0
    text = path.read_text(encoding="utf-8")
    waited = 'cnt="1" depid="2" deps="1" hasdep="1"/>\n    </tb>\n    <tb id="2"'
    assert waited in text
    path.write_text(text.replace(waited, waited.replace('hasdep="1"', 'hasdep="0"'), 1), encoding="utf-8")
    line = one_error(run("verify", str(path)), 1)
    assert line.endswith(
        'gpu 0 tb 3 step 0: depends on tb 1 step 0, which lacks hasdep="1", as do all later steps of tb 1: '
        "the wait never ends (only hasdep steps signal)"
    )


@pytest.mark.parametrize("command", ["verify", "show"])
def test_a_dependency_released_by_a_later_hasdep_step_is_a_warning(tmp_path: Path, command: str) -> None:
    """gpu 0 tb 3 step 1 waits for tb 0 step 0; without hasdep there, the kernel's ``flag >= goal``
    releases it when tb 0 step 1 signals: later than written, and still correct."""
    path = tmp_path / "s.xml"
    assert run("synth", "--gpus", "4", "-o", str(path)).exit_code == 0
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('hasdep="1"', 'hasdep="0"', 1), encoding="utf-8")
    result = run(command, str(path))
    assert result.exit_code == 0, result.output
    assert "proved: stragglar-n4-s3-simple" in result.stdout and "warning" not in result.stdout
    assert result.stderr.splitlines() == [
        f'warning: {path}: line 17: gpu 0 tb 3 step 1: depends on tb 0 step 0, which lacks hasdep="1": '
        "released late, when tb 0 step 1 (hasdep) signals"
    ]


def test_verify_warns_of_a_max_bytes_only_one_executor_reads_as_no_limit(tmp_path: Path) -> None:
    """The Azure executor loads and runs maxBytes="0" (no limit), so verify proves it; microsoft/msccl
    never selects it, which the warning says (export refuses to write it)."""
    path = tmp_path / "s.xml"
    assert run("synth", "--gpus", "4", "-o", str(path)).exit_code == 0
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace('maxBytes="1099511627776"', 'maxBytes="0"'), encoding="utf-8")
    result = run("verify", str(path))
    assert result.exit_code == 0 and result.stdout.startswith(f"{path}: proved: ")
    assert result.stderr.splitlines() == [
        f"warning: {path}: line 1: maxBytes 0 is no limit to the Azure executor, never selected by "
        "microsoft/msccl (minBytes <= size < maxBytes)"
    ]
    json_path = tmp_path / "s.json"
    assert run("synth", "--gpus", "4", "-o", str(json_path)).exit_code == 0
    refused = run("export", str(json_path), "--max-bytes", "0", "-o", str(tmp_path / "x.xml"))
    assert "maxBytes 0 is no limit to the Azure executor" in one_error(refused, 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["synth", "--gpus", "200", "--format", "msccl"],
            "200 GPUs: stragglar writes MSCCL XML for at most 128",
        ),
        (["synth", "--gpus", "100", "--format", "msccl", "--instances", "2"], "ids <= 127"),
        (["synth", "--gpus", "4", "--format", "msccl", "--proto", "LL64"], "--proto"),
        (["synth", "--gpus", "4", "--format", "msccl", "--instances", "0"], "--instances"),
        (["verify", "missing.xml"], "file not found: missing.xml"),
    ],
)
def test_export_bad_input(args: list[str], message: str) -> None:
    assert message in one_error(run(*args), 2)


@pytest.mark.parametrize(
    ("fmt", "message"),
    [
        ("msccl", "200 GPUs: stragglar writes MSCCL XML for at most 128"),
        ("mscclpp", "200 GPUs: stragglar writes MSCCL++ plans for at most 192"),
    ],
)
def test_export_refuses_a_schedule_too_large_before_proving_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, message: str
) -> None:
    """A 2048-GPU file was read, then proved (half a minute), and only then refused."""
    schedule_json.write(synthesize("stragglar", 200), tmp_path / "big.json")

    def never(*args: object) -> None:
        raise AssertionError("proved before the refusal")

    monkeypatch.setattr(schedules, "proved", never)
    line = one_error(run("export", str(tmp_path / "big.json"), "--format", fmt, "-o", str(tmp_path / "x")), 2)
    assert line.startswith(f"Error: {message}")


def test_export_refuses_a_chunk_count_and_names_the_command_that_makes_one(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    assert run("synth", "--gpus", "4", "-o", str(path)).exit_code == 0
    line = one_error(run("export", str(path), "--chunks", "32", "-o", str(tmp_path / "x.json")), 2)
    assert "--chunks does not apply" in line and "stragglar synth --gpus N --chunks" in line
    assert [p.name for p in tmp_path.iterdir()] == ["s.json"]  # nothing written


def test_verify_smt_and_its_counter_example(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    assert run("synth", "--gpus", "5", "-o", str(path)).exit_code == 0
    assert "(z3, " in run("verify", "--smt", str(path)).output
    line = one_error(run("verify", "--smt", str(tampered(tmp_path))), 1)
    assert "round" in line and "rank" in line and "chunk" in line


def test_synth_method_smt_is_round_optimal_and_proved() -> None:
    result = run("synth", "--gpus", "5", "--method", "smt", "--straggler", "1")
    assert result.exit_code == 0, result.output
    assert "(straggler 1)" in result.output and "R*(5) = 6: optimal" in result.output
    assert "only" in one_error(run("synth", "--gpus", "4", "-a", "ring", "--method", "smt"), 2)


def test_several_chunks_on_one_link_count_as_that_many_steps(tmp_path: Path) -> None:
    """Direct's whole-buffer rounds, labelled StragglAR: 2 rounds after the straggler arrives, below
    R*(4) = 4 if rounds were counted, but 6 chunk-steps, which is what the bound is about."""
    s = replace(synthesize("direct", 4), algorithm="stragglar")
    path = tmp_path / "fat.json"
    schedule_json.write(s, path)
    result = run("show", str(path))
    assert result.exit_code == 0, result.output
    summary = result.stdout.splitlines()[-1]
    assert "2 rounds (6 chunk-steps) after the straggler arrives (lower bound R*(4) = 4: +2)" in summary


def test_an_option_for_json_schedules_names_the_artifact_in_a_sentence(tmp_path: Path) -> None:
    """It read "p.json is MSCCL++ plan"."""
    plan = tmp_path / "p.json"
    assert run("synth", "--gpus", "4", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    assert one_error(run("verify", "--smt", str(plan)), 2).endswith(
        "p.json is an MSCCL++ plan; --smt proves JSON schedules"
    )
    assert one_error(run("show", "--plot", str(tmp_path / "x.png"), str(plan)), 2).endswith(
        "p.json is an MSCCL++ plan; --plot draws JSON schedules"
    )


def test_one_gpu_and_one_chunk_are_said_in_the_singular(tmp_path: Path) -> None:
    """The XML summaries said "1 chunks per loop" where synth's own says "1 chunk"."""
    out = tmp_path / "n2.xml"
    made = run("synth", "--gpus", "2", "-o", str(out))
    assert made.exit_code == 0, made.output
    assert "1 chunk per loop" in run("verify", str(out)).output
    assert run("show", str(out)).output.startswith("stragglar-n2-s1-simple: 2 GPUs, 1 chunk per loop,")
    plan = tmp_path / "n2-plan.json"
    assert run("synth", "--gpus", "2", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    assert ", 1 chunk, " in run("verify", str(plan)).output


def test_export_to_a_name_whose_suffix_means_another_format_says_which(tmp_path: Path) -> None:
    schedule = tmp_path / "s4.json"
    run("synth", "--gpus", "4", "-o", str(schedule))
    line = one_error(run("export", str(schedule), "-o", str(tmp_path / "s4.txt")), 2)
    assert line.endswith("this command writes json, msccl, mscclpp, not text (a .txt name means it)"), line
