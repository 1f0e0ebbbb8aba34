"""MSCCL++ execution plans: lower a schedule to the executor's JSON, and prove any such plan.

Lowering (:func:`lower`) and proving (:func:`prove_plan`) are independent: the prover re-reads the
JSON text with the executor's rules and shares no data structure with the lowering.
"""

from stragglar.mscclpp.errors import (
    PlanError,
    PlanFormatError,
    PlanViolation,
    PlanViolationError,
    UnsupportedPlanError,
)
from stragglar.mscclpp.lower import (
    DEFAULT_MAX_THREADBLOCKS,
    MscclppExportError,
    MscclppPlan,
    PlanOptions,
    default_name,
    lower,
    write_plan,
)
from stragglar.mscclpp.sizes import SizeDecision, SizeRule, size_rule, will_use

__all__ = [
    "DEFAULT_MAX_THREADBLOCKS",
    "MscclppExportError",
    "MscclppPlan",
    "PlanError",
    "PlanFormatError",
    "PlanOptions",
    "PlanViolation",
    "PlanViolationError",
    "SizeDecision",
    "SizeRule",
    "UnsupportedPlanError",
    "default_name",
    "lower",
    "size_rule",
    "will_use",
    "write_plan",
]
