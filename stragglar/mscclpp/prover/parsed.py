"""The prover's records of an execution plan: how the kernel reads each op, and the plan with every
reference resolved.

Nothing here comes from the lowering: :func:`~stragglar.mscclpp.prover.read.read_plan` fills these
from the text, with the :class:`Walker` that names the place of every problem; the executor's own
limits and names are the format's vocabulary (:mod:`stragglar.mscclpp.vocabulary`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from stragglar.errors import shown
from stragglar.mscclpp.errors import PlanFormatError, PlanViolation, PlanViolationError, UnsupportedPlanError
from stragglar.mscclpp.vocabulary import UINT64_MAX

__all__ = ["Gpu", "Op", "Plan", "Ref", "Tb", "Walker"]

UNSUPPORTED_OPS = {
    **dict.fromkeys(
        ["ppkt", "rppkt", "respkt", "cpkt", "upkt", "repkt", "recpkt", "recspkt"], "LL packet op"
    ),
    **dict.fromkeys(["pws", "pwsf", "flush"], "port-channel op"),
    **dict.fromkeys(["glres", "gstore", "gstorepkt"], "NVLS switch op"),
    "pipeline": "pipelined loop",
}
# Operands each data op takes, as the kernel reads them: L a local buffer, R a remote one.
SHAPES = {
    "put": ("L+", "R+"),
    "get": ("R+", "L+"),
    "copy": ("L", "L"),
    "re": ("L+", "L"),
    "res": ("L+", "LR*"),
    "rre": ("LR+", "L"),
    "rres": ("LR+", "LR*"),
}
SHAPE_WORDS = {
    "L+": "local buffers",
    "R+": "remote buffers",
    "L": "one local buffer",
    "LR+": "a local buffer then remote buffers",
    "LR*": "a local buffer, then any remote buffers",
}
SYNC_OPS = frozenset({"signal", "wait", "rlxsignal", "rlxwait"})


@dataclass(frozen=True, slots=True)
class Ref:
    """A chunk range an op touches: ``size`` chunks from ``index`` of buffer ``buffer`` of ``gpu``."""

    gpu: int
    buffer: str
    index: int
    size: int


@dataclass(frozen=True, slots=True)
class Op:
    """One op, references resolved.

    ``endpoints``: global memory-channel endpoint per lane (signal/wait);
    ``semaphores``: GPU-level device semaphore ids; ``barrier``: (id, number of thread blocks).
    """

    name: str
    index: int
    endpoints: tuple[int, ...] = ()
    src: tuple[Ref, ...] = ()
    dst: tuple[Ref, ...] = ()
    semaphores: tuple[int, ...] = ()
    barrier: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class Tb:
    gpu: int
    id: int
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class Gpu:
    id: int
    input_chunks: int
    output_chunks: int
    scratch_chunks: int
    semaphores: tuple[int, ...]
    tbs: tuple[Tb, ...]


@dataclass(frozen=True, slots=True)
class Plan:
    """A plan as the executor sees it.  ``partner[e]`` is the endpoint connected to endpoint ``e``
    (-1 if none); ``endpoint_owner[e]`` is (gpu, index in the GPU's memory channel list, peer)."""

    name: str
    collective: str
    inplace: bool
    buffer_alignment: int
    min_message_size: int
    max_message_size: int
    num_threads_per_block: int
    gpus: tuple[Gpu, ...]
    partner: tuple[int, ...]
    endpoint_owner: tuple[tuple[int, int, int], ...]

    @property
    def chunks(self) -> int:
        return self.gpus[0].input_chunks


class Walker:
    """Walks the JSON object and names the current place in messages (built only on error)."""

    def __init__(self) -> None:
        self.gpu = self.tb = self.op = -1
        self.opname = ""
        self.part: str | tuple[str, int] = ""

    def at(self, gpu: int = -1, tb: int = -1, op: int = -1, opname: str = "", part: str = "") -> None:
        self.gpu, self.tb, self.op, self.opname, self.part = gpu, tb, op, opname, part

    def where(self) -> str:
        if self.gpu < 0:
            place = "plan"
        else:
            place = f"gpu {self.gpu}"
            if self.tb >= 0:
                place += f" tb {self.tb}"
            if self.op >= 0:
                place += f" op {self.op}" + (f" ({self.opname})" if self.opname else "")
        part = self.part if isinstance(self.part, str) else f"{self.part[0]}[{self.part[1]}]"
        return f"{place} {part}" if part else place

    def fail(self, message: str) -> PlanFormatError:
        return PlanFormatError(f"{self.where()}: {message}")

    def bad(self, kind: str, message: str) -> PlanViolationError:
        return PlanViolationError(
            PlanViolation(kind, self.gpu, self.tb, self.op, f"{self.where()}: {message}")
        )

    def unsupported(self, message: str) -> UnsupportedPlanError:
        return UnsupportedPlanError(f"{self.where()}: {message}")

    def get(
        self, obj: dict[str, Any], key: str, kind: type, default: Any = None, required: bool = True
    ) -> Any:
        if key not in obj:
            if required:
                raise self.fail(f"missing key '{key}'")
            return default
        value = obj[key]
        if type(value) is not kind:
            raise self.fail(f"'{key}' must be {_TYPE_NAMES[kind]}, got {json.dumps(value)[:40]}")
        return value

    def count(self, obj: dict[str, Any], key: str, default: int = 0, required: bool = True) -> int:
        """A count or an index: what the executor reads into an unsigned field of 64 bits at most,
        so a negative number, or one past 2^64 - 1, is read as another (malformed, as the plan's
        sizes are), where one it holds may still be wrong for the plan (past a buffer's end)."""
        value: int = self.get(obj, key, int, default, required)
        if not 0 <= value <= UINT64_MAX:
            side = "must not be negative" if value < 0 else "must fit 64 bits"
            raise self.fail(f"'{key}' {side}, got {shown(value, 40)}")
        return value

    def ints(self, obj: dict[str, Any], key: str) -> list[int]:
        values: list[Any] = self.get(obj, key, list)
        for v in values:
            if type(v) is not int or v < 0:
                raise self.fail(f"'{key}' must be a list of non-negative integers")
        return values

    def objects(self, obj: dict[str, Any], key: str, required: bool = True) -> list[dict[str, Any]]:
        values: list[Any] = self.get(obj, key, list, [], required)
        for v in values:
            if type(v) is not dict:
                raise self.fail(f"every entry of '{key}' must be an object")
        return values


_TYPE_NAMES = {int: "an integer", str: "a string", bool: "true or false", list: "a list", dict: "an object"}
