"""Lowering stage 5: the XML text, in the shape the executors' tokenizer needs.

The same file loads on the Azure executor, the older microsoft/msccl runtime and RCCL: every
attribute is written (``name``, ``outofplace``, ``minBytes``, an explicit large ``maxBytes``), with
no declaration, no tabs, double quotes and one line per element.
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.msccl.lowering.dependencies import Programs, Step
from stragglar.msccl.lowering.threadblocks import ThreadBlock
from stragglar.msccl.vocabulary import StepRecord

__all__ = ["Header", "render"]


@dataclass(frozen=True)
class Header:
    """The ``<algo>`` element's attributes."""

    name: str
    proto: str
    nchannels: int
    nchunksperloop: int
    ngpus: int
    min_bytes: int
    max_bytes: int | None  # None until the lowering knows the scratch: the default for the file


def render(header: Header, programs: Programs, numbered: list[list[ThreadBlock]], scratch: list[int]) -> str:
    """The whole file: the algo, then per GPU its TBs in id order (``numbered``, each GPU's TBs with
    its id as their index), each with its steps."""
    assert header.max_bytes is not None
    lines = [
        f'<algo name="{header.name}" proto="{header.proto}" nchannels="{header.nchannels}" '
        f'nchunksperloop="{header.nchunksperloop}" ngpus="{header.ngpus}" coll="allreduce" inplace="1" '
        f'outofplace="0" minBytes="{header.min_bytes}" maxBytes="{header.max_bytes}">'
    ]
    ids = {tb: i for tbs in numbered for i, tb in enumerate(tbs)}
    for g, tbs in enumerate(numbered):
        chunks = header.nchunksperloop
        lines.append(f'  <gpu id="{g}" i_chunks="{chunks}" o_chunks="0" s_chunks="{scratch[g]}">')
        for tb in tbs:
            lines.append(f'    <tb id="{ids[tb]}" send="{tb.send}" recv="{tb.recv}" chan="{tb.chan}">')
            lines += [_record(s, ids).line(i) for i, s in enumerate(programs.steps[tb])]
            lines.append("    </tb>")
        lines.append("  </gpu>")
    return "\n".join([*lines, "</algo>"]) + "\n"


def _record(step: Step, ids: dict[ThreadBlock, int]) -> StepRecord:
    depid, deps = (ids[step.dep[0]], step.dep[1]) if step.dep else (-1, -1)
    return StepRecord.of(step.operands, depid, deps, int(step.hasdep))
