"""The shipped schedules/ folder is exactly what the generator makes, and every file proves itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from stragglar.formats import json as json_format
from stragglar.msccl import prove_msccl
from stragglar.release import RELEASED_SIZES, write_release
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
    (xml_path,) = (SHIPPED / "msccl").glob(f"stragglar-n{n}-s*-simple.xml")
    schedule = json_format.read(json_path)
    proof = prove(schedule)
    assert proof.num_ranks == n and schedule.exposed_rounds == round_lower_bound(n)
    xml_proof = prove_msccl(xml_path.read_text(encoding="utf-8"))
    assert xml_proof.ngpus == n and xml_proof.nchunks == n - 1


def test_the_xml_folder_holds_only_xml() -> None:
    """The MSCCL executor parses every file of MSCCL_ALGO_DIR: nothing else may live there."""
    assert {p.suffix for p in (SHIPPED / "msccl").iterdir()} == {".xml"}
