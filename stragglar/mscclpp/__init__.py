"""MSCCL++ execution plans: lower a schedule to the executor's JSON, prove any such plan, describe it.

* :func:`lower` (stages in :mod:`stragglar.mscclpp.lower`) turns a proved schedule into an
  in-place AllReduce plan on memory channels; :func:`write_plan` writes it atomically.
* :func:`prove_plan` / :func:`check_plan` prove a plan from its text alone (any plan, ours or hand
  written); they share no data structure with the lowering.
* :func:`will_use` / :func:`size_rule` say which buffer sizes the executor runs a plan on;
  :func:`summarize` counts what a plan contains, for ``show``.
* :func:`plan_document` parses a plan's text once, with the checks every reader of plans shares;
  the prover, the size rule and the summary take the text or that :class:`PlanDocument`.
* :mod:`stragglar.mscclpp.register` registers a plan with MSCCL++ (import-guarded).
"""

from stragglar.mscclpp.document import PlanDocument, PlanSource, plan_document
from stragglar.mscclpp.errors import (
    PlanError,
    PlanFormatError,
    PlanViolation,
    PlanViolationError,
    UnsupportedPlanError,
)
from stragglar.mscclpp.lower import (
    DEFAULT_MAX_THREADBLOCKS,
    MAX_PLAN_CELLS,
    MAX_PLAN_RANKS,
    MscclppExportError,
    MscclppPlan,
    PlanOptions,
    check_request,
    default_name,
    lower,
    write_plan,
)
from stragglar.mscclpp.prove import DEFAULT_INTERLEAVINGS, PlanProof, check_plan, prove_plan
from stragglar.mscclpp.sizes import SizeDecision, SizeRule, size_rule, will_use
from stragglar.mscclpp.summary import PlanSummary, summarize

__all__ = [
    "DEFAULT_INTERLEAVINGS",
    "DEFAULT_MAX_THREADBLOCKS",
    "MAX_PLAN_CELLS",
    "MAX_PLAN_RANKS",
    "MscclppExportError",
    "MscclppPlan",
    "PlanDocument",
    "PlanError",
    "PlanFormatError",
    "PlanOptions",
    "PlanProof",
    "PlanSource",
    "PlanSummary",
    "PlanViolation",
    "PlanViolationError",
    "SizeDecision",
    "SizeRule",
    "UnsupportedPlanError",
    "check_plan",
    "check_request",
    "default_name",
    "lower",
    "plan_document",
    "prove_plan",
    "size_rule",
    "summarize",
    "will_use",
    "write_plan",
]
