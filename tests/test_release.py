"""The shipped schedules/ folder is exactly what the generator makes, and every file proves itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from stragglar.formats import schedule_json
from stragglar.model import best_chunks
from stragglar.msccl import prove as prove_msccl
from stragglar.mscclpp import prove as prove_plan
from stragglar.release import CHUNKED_RELEASES, MSCCL_SIZES, RELEASED_SIZES, write_release
from stragglar.schedule import round_lower_bound
from stragglar.verify import prove

SHIPPED = Path(__file__).resolve().parent.parent / "schedules"


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_regenerating_gives_the_shipped_files_byte_for_byte(tmp_path: Path) -> None:
    write_release(tmp_path)
    fresh, shipped = files_under(tmp_path), files_under(SHIPPED)
    assert sorted(fresh) == sorted(shipped)
    assert [name for name in fresh if fresh[name] != shipped[name]] == []


@pytest.mark.parametrize("n", RELEASED_SIZES)
def test_each_shipped_file_is_proved_from_the_file_itself(n: int) -> None:
    (json_path,) = (SHIPPED / "json").glob(f"stragglar-n{n}-s{n - 1}.json")
    schedule = schedule_json.read(json_path)
    proof = prove(schedule)
    assert proof.num_ranks == n and schedule.exposed_rounds == round_lower_bound(n)
    xml_paths = list((SHIPPED / "msccl").glob(f"stragglar-n{n}-s{n - 1}-simple.xml"))
    assert len(xml_paths) == (n in MSCCL_SIZES)
    for xml_path in xml_paths:
        xml_proof = prove_msccl(xml_path.read_text(encoding="utf-8"))
        assert xml_proof.gpus == n and xml_proof.chunks == n - 1
    (plan_path,) = (SHIPPED / "mscclpp").glob(f"stragglar-n{n}-s{n - 1}-mscclpp.json")
    plan_proof = prove_plan(plan_path.read_text(encoding="utf-8"))
    assert plan_proof.gpus == n and plan_proof.chunks == n - 1


@pytest.mark.parametrize(("n", "c"), CHUNKED_RELEASES)
def test_each_shipped_chunked_file_is_proved_at_the_bound(n: int, c: int) -> None:
    base = f"stragglar-n{n}-s{n - 1}-c{c}"
    schedule = schedule_json.read(SHIPPED / "json" / f"{base}.json")
    assert prove(schedule).num_ranks == n and schedule.num_chunks == c
    assert schedule.exposed_rounds == round_lower_bound(n, c) == c + (n - 1).bit_length() - 1
    xml_proof = prove_msccl((SHIPPED / "msccl" / f"{base}-simple.xml").read_text(encoding="utf-8"))
    assert (xml_proof.gpus, xml_proof.chunks) == (n, c)
    plan_proof = prove_plan((SHIPPED / "mscclpp" / f"{base}-mscclpp.json").read_text(encoding="utf-8"))
    assert (plan_proof.gpus, plan_proof.chunks) == (n, c)


@pytest.mark.parametrize(("n", "c"), CHUNKED_RELEASES)
def test_shipped_chunk_counts_are_the_models_power_of_two_choice(n: int, c: int) -> None:
    assert best_chunks(n, 2**30, 0.01, power_of_two=True) == c


def test_every_shipped_plan_verifies_with_the_command() -> None:
    from click.testing import CliRunner

    from stragglar.cli import cli

    plans = sorted(str(p) for p in (SHIPPED / "mscclpp").glob("*.json") if p.stat().st_size < 2**20)
    assert len(plans) >= 8  # the small ones: each plan is also proved from its file above
    result = CliRunner().invoke(cli, ["prove-all", *plans])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"proved all {len(plans)} files"


def test_the_xml_folder_holds_only_xml() -> None:
    """The MSCCL executor parses every file of MSCCL_ALGO_DIR: nothing else may live there."""
    assert {p.suffix for p in (SHIPPED / "msccl").iterdir()} == {".xml"}


def test_the_module_says_its_usage_and_writes_nothing_for_an_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``python -m stragglar.release --help`` wrote the whole release into a folder named --help."""
    from stragglar.release import main

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert (
        done.value.code == 0 and "usage: python -m stragglar.release [-h] [FOLDER]" in capsys.readouterr().out
    )
    (tmp_path / "taken").write_text("a file\n")
    for argv, said in ((["-x"], "unrecognized arguments: -x"), (["taken"], "taken is not a folder")):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2 and said in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]
