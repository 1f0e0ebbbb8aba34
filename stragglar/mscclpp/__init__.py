"""MSCCL++ execution plans: lower a schedule to the executor's JSON, prove any such plan, describe it.

* :func:`lower` (:mod:`stragglar.mscclpp.lowering`; options in :class:`PlanOptions`) turns a proved
  schedule into an in-place AllReduce plan on memory channels; :func:`write_plan` writes it
  atomically.
* :func:`read` parses a plan's text once, with the checks every reader of plans shares (a
  :class:`PlanDocument`); the prover, the size rule and the description take the text or that
  document (:func:`adopt` makes that document of text parsed already).
* :func:`prove` / :func:`check_plan` prove a plan from its text alone (any plan, ours or hand
  written; :mod:`stragglar.mscclpp.prover`); they share no data structure with the lowering, only
  the format's vocabulary (:mod:`stragglar.mscclpp.vocabulary`).
* :func:`will_use` / :func:`size_rule` say which buffer sizes the executor runs a plan on;
  :func:`describe` / :func:`summarize` say what a plan contains, for ``show``.
* :func:`check_request` refuses, before the schedule is made, a request whose plan stragglar
  would not write or the executor not take.
* :mod:`stragglar.mscclpp.register` registers a plan with MSCCL++ (import-guarded).

``plan_document`` and ``prove_plan`` are the older names of :func:`read` and :func:`prove`:
deprecated, each call warns.
"""

from stragglar.mscclpp.document import PlanDocument, PlanSource, adopt, plan_document
from stragglar.mscclpp.errors import (
    MscclppExportError,
    PlanError,
    PlanFormatError,
    PlanViolation,
    PlanViolationError,
    UnsupportedPlanError,
)
from stragglar.mscclpp.lowering.lower import (
    DEFAULT_MAX_THREADBLOCKS,
    MAX_PLAN_CELLS,
    MAX_PLAN_RANKS,
    MscclppPlan,
    PlanOptions,
    check_request,
    default_name,
    lower,
    write_plan,
)
from stragglar.mscclpp.prover.prove import DEFAULT_INTERLEAVINGS, PlanProof, prove
from stragglar.mscclpp.prover.prove import check as check_plan
from stragglar.mscclpp.sizes import SizeDecision, SizeRule, size_rule, will_use
from stragglar.mscclpp.summary import PlanSummary, describe, summarize
from stragglar.renamed import renamed

read = plan_document  # the verb both formats share
prove_plan = renamed("stragglar.mscclpp.prove_plan", "stragglar.mscclpp.prove", prove)
plan_document = renamed("stragglar.mscclpp.plan_document", "stragglar.mscclpp.read", read)

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
    "adopt",
    "check_plan",
    "check_request",
    "default_name",
    "describe",
    "lower",
    "plan_document",
    "prove",
    "prove_plan",
    "read",
    "size_rule",
    "summarize",
    "will_use",
    "write_plan",
]
