"""The MSCCL++ integration, on CPU, against a fake ``mscclpp`` module that records every call."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stragglar.mscclpp import PlanViolationError, lower
from stragglar.mscclpp.register import make_selector, mscclpp_algorithm, register_plan
from stragglar.synth import synthesize
from stragglar.verify import prove

PLAN = lower(prove(synthesize("stragglar", 4)))  # 3 chunks: sizes must be multiples of 48 bytes


class FakeMscclpp:
    """Records calls the way the real classes would receive them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        fake = self

        class ExecutionPlan:
            def __init__(self, path: str, rank: int) -> None:
                fake.calls.append(("ExecutionPlan", (path, rank)))
                self.path, self.rank = path, rank

        class Algorithm:
            class Constraint:
                def __init__(self, world_size: int = 0, n_ranks_per_node: int = 0) -> None:
                    self.world_size, self.n_ranks_per_node = world_size, n_ranks_per_node

            def __init__(
                self, id: str, execution_plan: ExecutionPlan, constraint: Any, tags: dict[str, int]
            ) -> None:
                fake.calls.append(("Algorithm", id))
                self.id, self.execution_plan, self.constraint, self.tags = (
                    id,
                    execution_plan,
                    constraint,
                    tags,
                )

        class AlgorithmCollectionBuilder:
            def add_algorithm_builder(self, algorithm: Any) -> None:
                fake.calls.append(("add_algorithm_builder", algorithm))

            def set_algorithm_selector(self, selector: Any) -> None:
                fake.calls.append(("set_algorithm_selector", selector))

        self.module = types.ModuleType("mscclpp")
        self.ext = types.ModuleType("mscclpp.ext")
        self.module.ExecutionPlan = ExecutionPlan  # type: ignore[attr-defined]
        self.module.Algorithm = Algorithm  # type: ignore[attr-defined]
        self.ext.AlgorithmCollectionBuilder = AlgorithmCollectionBuilder  # type: ignore[attr-defined]
        self.module.ext = self.ext  # type: ignore[attr-defined]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeMscclpp:
    f = FakeMscclpp()
    monkeypatch.setitem(sys.modules, "mscclpp", f.module)
    monkeypatch.setitem(sys.modules, "mscclpp.ext", f.ext)
    return f


@dataclass
class Request:
    """The fields of mscclpp's CollectiveRequest that a selector reads."""

    collective: str = "allreduce"
    world_size: int = 4
    n_ranks_per_node: int = 4
    message_size: int = 48 * 1024
    input_buffer: int = 0x1000
    output_buffer: int = 0x1000


def test_register_writes_the_plan_wraps_it_and_installs_the_selector(
    fake: FakeMscclpp, tmp_path: Path
) -> None:
    reg = register_plan(PLAN, 2, plan_dir=tmp_path)
    path = tmp_path / "stragglar-n4-s3.json"
    assert path.read_text() == PLAN.text
    names = [name for name, _ in fake.calls]
    assert names == ["ExecutionPlan", "Algorithm", "add_algorithm_builder", "set_algorithm_selector"]
    assert fake.calls[0][1] == (str(path), 2)
    assert reg.algorithm.constraint.world_size == 4 and reg.algorithm.constraint.n_ranks_per_node == 4
    assert fake.calls[2][1] is reg.algorithm and fake.calls[3][1] is reg.selector
    assert reg.selector({"allreduce": {reg.name: reg.algorithm}}, Request()) is reg.algorithm


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("collective", "allgather"),
        ("world_size", 8),
        ("n_ranks_per_node", 2),
        ("output_buffer", 0x2000),  # out of place
        ("message_size", 1 << 20),  # not a multiple of 48
        ("message_size", 0),
    ],
)
def test_selector_falls_back_unless_everything_matches(field: str, value: object) -> None:
    selector = make_selector(PLAN)
    algorithms = {"allreduce": {PLAN.name: "ours"}}
    assert selector(algorithms, Request()) == "ours"
    request = Request()
    setattr(request, field, value)
    assert selector(algorithms, request) is None


def test_selector_chains_to_the_fallback() -> None:
    seen: list[Any] = []

    def fallback(algorithms: Any, request: Any) -> str:
        seen.append(request)
        return "native"

    selector = make_selector(PLAN, fallback=fallback)
    request = Request(world_size=8)
    assert selector({"allreduce": {PLAN.name: "ours"}}, request) == "native"
    assert seen == [request]
    assert selector({}, Request()) == "native"  # our plan was not registered in this collection


def test_size_window_is_the_plans(fake: FakeMscclpp) -> None:
    selector = make_selector(PLAN)
    algorithms = {"allreduce": {PLAN.name: "ours"}}
    assert selector(algorithms, Request(message_size=PLAN.rule.max_message_size)) == "ours"
    assert selector(algorithms, Request(message_size=PLAN.rule.max_message_size + 48)) is None


def test_algorithm_reuses_an_identical_file_and_rewrites_a_stale_one(
    fake: FakeMscclpp, tmp_path: Path
) -> None:
    path = tmp_path / f"{PLAN.name}.json"
    path.write_text("stale")
    mscclpp_algorithm(PLAN, 0, plan_dir=tmp_path, tags={"stragglar": 1})
    assert path.read_text() == PLAN.text
    stamp = path.stat().st_mtime_ns
    algo = mscclpp_algorithm(PLAN, 1, plan_dir=tmp_path)
    assert path.stat().st_mtime_ns == stamp and algo.execution_plan.rank == 1
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_register_refuses_a_wrong_plan_before_touching_mscclpp(fake: FakeMscclpp, tmp_path: Path) -> None:
    broken = PLAN.text.replace('"name":"re"', '"name":"copy"', 1)
    with pytest.raises(PlanViolationError):
        register_plan(broken, 0, plan_dir=tmp_path)
    assert fake.calls == []


def test_without_mscclpp_the_error_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mscclpp", None)
    with pytest.raises(ImportError, match=r"github\.com/microsoft/mscclpp"):
        register_plan(PLAN, 0)
