"""Run a stragglar plan through MSCCL++: wrap it as an ``mscclpp.Algorithm`` with a selector.

Not yet run on hardware: this follows the API of MSCCL++'s ``examples/torch-integration/``
(``dsl_with_nccl_api.py``) and ``python/mscclpp/_core/algorithm.py`` as of 2026-08, and is tested
on CPU against a fake ``mscclpp`` module that records the calls.  ``mscclpp`` is imported only
inside the functions, so this module loads without it.

How it is used, on every rank, before ``torch.distributed.init_process_group(backend="nccl")``, with
the process started under ``LD_PRELOAD=<mscclpp>/lib/libmscclpp_nccl.so`` so that NCCL calls go
through MSCCL++'s shim::

    from stragglar.mscclpp import lower
    from stragglar.mscclpp.register import register_plan
    register_plan(lower(prove(schedule)), rank)

:func:`register_plan` writes the plan (atomically) where ``mscclpp.ExecutionPlan`` can read it,
builds the ``Algorithm`` with a world-size / ranks-per-node constraint, adds it to the
``AlgorithmCollectionBuilder`` singleton and installs :func:`make_selector`'s selector.  The
selector picks the plan only for an AllReduce of the plan's world size on one node (memory
channels need peer access), in place (input pointer == output pointer) and of a size the plan
accepts (:mod:`stragglar.mscclpp.sizes`); otherwise it defers to ``fallback`` (if given) and then
returns None, which makes MSCCL++ use its native kernels or the real NCCL.  The selector checks
in-place mode itself because ``DslAlgorithm::bufferMode`` caches one mode for all DSL plans.

A plan always sums: MSCCL++ runs it with its sum kernels whatever reduction the caller asked for,
and its ``CollectiveRequest`` does not carry the reduction, so the selector cannot pass a MAX, MIN,
PRODUCT or AVG all_reduce on; register a plan only where the all_reduces of its sizes are sums.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stragglar.mscclpp.lowering.lower import MscclppPlan, write_plan
from stragglar.mscclpp.prover.prove import prove as prove_plan  # `prove` is an argument below
from stragglar.mscclpp.sizes import SizeRule
from stragglar.mscclpp.summary import summarize

__all__ = ["Registration", "Selector", "make_selector", "mscclpp_algorithm", "register_plan"]

Selector = Callable[[Mapping[str, Mapping[str, Any]], Any], Any]


@dataclass(frozen=True, slots=True)
class _Facts:
    name: str
    text: str
    world_size: int
    collective: str
    inplace: bool
    rule: SizeRule


def _facts(plan: MscclppPlan | str) -> _Facts:
    text = plan.text if isinstance(plan, MscclppPlan) else plan
    facts = summarize(text)
    return _Facts(facts.name, text, facts.gpus, facts.collective, facts.inplace, facts.rule)


def _import_mscclpp() -> Any:
    try:
        mscclpp = importlib.import_module("mscclpp")
        importlib.import_module("mscclpp.ext")
    except ImportError as exc:
        raise ImportError(
            "MSCCL++'s Python package is needed (not on PyPI: build it from github.com/microsoft/mscclpp, "
            f"pip install . in its python folder): {exc}"
        ) from exc
    return mscclpp


def mscclpp_algorithm(
    plan: MscclppPlan | str,
    rank: int,
    *,
    plan_dir: str | os.PathLike[str] | None = None,
    tags: Mapping[str, int] | None = None,
) -> Any:
    """The plan as an ``mscclpp.Algorithm`` for ``rank``: its JSON is written to ``plan_dir``
    (default: ``<tmp>/stragglar-mscclpp``) as ``<name>.json`` and loaded with ``mscclpp.ExecutionPlan``."""
    mscclpp = _import_mscclpp()
    facts = _facts(plan)
    folder = Path(plan_dir) if plan_dir is not None else Path(tempfile.gettempdir()) / "stragglar-mscclpp"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{facts.name}.json"
    if not path.exists() or path.read_text(encoding="utf-8") != facts.text:
        write_plan(facts.text, path)
    execution_plan = mscclpp.ExecutionPlan(str(path), rank)
    constraint = mscclpp.Algorithm.Constraint(world_size=facts.world_size, n_ranks_per_node=facts.world_size)
    return mscclpp.Algorithm(
        id=facts.name, execution_plan=execution_plan, constraint=constraint, tags=dict(tags or {})
    )


def make_selector(plan: MscclppPlan | str, *, fallback: Selector | None = None) -> Selector:
    """A selector for ``AlgorithmCollectionBuilder.set_algorithm_selector`` that picks this plan when
    the request matches it (see the module docstring), else asks ``fallback``, else returns None."""
    facts = _facts(plan)

    def selector(algorithms: Mapping[str, Mapping[str, Any]], request: Any) -> Any:
        mine = algorithms.get(facts.collective, {}).get(facts.name)
        matches = (
            mine is not None
            and request.collective == facts.collective
            and request.world_size == facts.world_size
            and request.n_ranks_per_node == facts.world_size
            and (request.input_buffer == request.output_buffer) == facts.inplace
            and facts.rule.decide(request.message_size).used
        )
        if matches:
            return mine
        return fallback(algorithms, request) if fallback is not None else None

    return selector


@dataclass(frozen=True, slots=True)
class Registration:
    """What :func:`register_plan` installed."""

    name: str
    algorithm: Any
    selector: Selector


def register_plan(
    plan: MscclppPlan | str,
    rank: int,
    *,
    plan_dir: str | os.PathLike[str] | None = None,
    fallback: Selector | None = None,
    prove: bool = True,
) -> Registration:
    """Prove the plan (unless ``prove=False``), wrap it, add it to MSCCL++'s
    ``AlgorithmCollectionBuilder`` and install its selector.

    Proving N = 64 takes a few seconds per rank; pass ``prove=False`` for a plan already proved.
    """
    mscclpp = _import_mscclpp()
    facts = _facts(plan)
    if prove:
        prove_plan(facts.text)
    algorithm = mscclpp_algorithm(plan, rank, plan_dir=plan_dir)
    selector = make_selector(plan, fallback=fallback)
    builder = mscclpp.ext.AlgorithmCollectionBuilder()
    builder.add_algorithm_builder(algorithm)
    builder.set_algorithm_selector(selector)
    return Registration(facts.name, algorithm, selector)
