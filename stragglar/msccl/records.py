"""The ``<step>`` element as a typed record: what the writer prints and the reader parses into.

A record is the file format's own vocabulary (like the IR is the schedules'), not a structure of
the lowering: the writer turns its steps into records only to print them, and the prover judges
records parsed back from the text, so a writer that prints the wrong thing is judged by what it
printed.

>>> StepRecord("s", "i", 0, "i", 0, 1, -1, -1, 0).line(0).split()[:4]
['<step', 's="0"', 'type="s"', 'srcbuf="i"']
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Operands", "StepRecord"]


@dataclass(frozen=True)
class Operands:
    """What a step does: its type, where it reads and writes (buffer and chunk offset), how many chunks."""

    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int


@dataclass(frozen=True)
class StepRecord(Operands):
    """One ``<step>``: its operands and its dependency."""

    depid: int  # the thread block waited for, -1 for none
    deps: int  # the step of that thread block waited for
    hasdep: int  # 1 if other thread blocks wait for this step

    @classmethod
    def of(cls, operands: Operands, depid: int, deps: int, hasdep: int) -> StepRecord:
        o = operands
        return cls(o.type, o.srcbuf, o.srcoff, o.dstbuf, o.dstoff, o.cnt, depid, deps, hasdep)

    def line(self, position: int) -> str:
        """The element's text as the executor's tokenizer wants it: one line, double quotes."""
        return (
            f'      <step s="{position}" type="{self.type}" srcbuf="{self.srcbuf}" srcoff="{self.srcoff}" '
            f'dstbuf="{self.dstbuf}" dstoff="{self.dstoff}" cnt="{self.cnt}" depid="{self.depid}" '
            f'deps="{self.deps}" hasdep="{self.hasdep}"/>'
        )
