"""The shipped schedules/ folder is exactly what the generator makes, and every file proves itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from stragglar.formats import json as json_format
from stragglar.msccl import prove_msccl
from stragglar.mscclpp import prove_plan
from stragglar.release import MSCCL_SIZES, RELEASED_SIZES, write_release
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
    (json_path,) = (SHIPPED / "json").glob(f"stragglar-n{n}-s*.json")
    schedule = json_format.read(json_path)
    proof = prove(schedule)
    assert proof.num_ranks == n and schedule.exposed_rounds == round_lower_bound(n)
    xml_paths = list((SHIPPED / "msccl").glob(f"stragglar-n{n}-s*-simple.xml"))
    assert len(xml_paths) == (n in MSCCL_SIZES)
    for xml_path in xml_paths:
        xml_proof = prove_msccl(xml_path.read_text(encoding="utf-8"))
        assert xml_proof.ngpus == n and xml_proof.nchunks == n - 1
    (plan_path,) = (SHIPPED / "mscclpp").glob(f"stragglar-n{n}-s*-mscclpp.json")
    plan_proof = prove_plan(plan_path.read_text(encoding="utf-8"))
    assert plan_proof.gpus == n and plan_proof.chunks == n - 1


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
