"""The device program's prover is sound against every single change to small programs.

The hand-made mutants of test_runtime_device_prover.py and _direct.py are the changes we thought
of.  Here every small program (staged and direct, StragglAR, Ring, halving/doubling, Direct) is
changed in every way one change can: any cell of any row set to any value in its column's range,
a row deleted, a row repeated, a row swapped with the next.  Each changed program the prover
accepts must still sum right in two calls in a row, in every order drawn by a run that knows
nothing of the prover (:func:`test_runtime_device_prover_direct.interleaved`: rows atomic, flags
and inboxes kept from call to call); the run raising (a deadlock, a slot never written) fails it
too.  The prover may refuse a harmless change (that costs only speed); it must never accept a
harmful one.  The accepted changes are counted, so the property is never checked on nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest
from test_runtime_device_prover_direct import (
    copies,
    direct,
    kept_that_round,
    lowered,
    sums,
    sums_right,
    wholly_direct,
)

from stragglar.runtime.device.prover import refusal
from stragglar.runtime.device.table import DeviceProgram

ORDERS = 12  # orders drawn per accepted change (each also runs two calls)


def programs() -> dict[str, DeviceProgram]:
    stragglar = lowered("stragglar", 4)
    return {
        "stragglar 4 staged": stragglar,
        "stragglar 4 chunked staged": lowered("stragglar", 3, 4),
        "ring 3 staged": lowered("ring", 3),
        "direct 3 staged": lowered("direct", 3),
        "ring 4 direct": wholly_direct("ring", 4),
        "rhd 4 direct": wholly_direct("rhd", 4),
        "stragglar 4 direct": direct(
            stragglar, copies(stragglar), {t for t in sums(stragglar) if kept_that_round(stragglar, t)}
        ),
    }


def changes(program: DeviceProgram) -> Iterator[tuple[str, DeviceProgram]]:
    """Every program one change away from ``program``, each with what was changed."""
    tables = program.rows
    highest = np.max(np.concatenate(tables), axis=0)
    limits = [8, *(int(h) + 2 for h in highest[1:])]  # op codes; else one past the largest value used
    limits[2] = program.num_ranks
    limits[3] = program.num_chunks
    for rank, rows in enumerate(tables):
        for index in range(len(rows)):
            for column, limit in enumerate(limits):
                for value in range(limit):
                    if value != rows[index, column]:
                        changed = rows.copy()
                        changed[index, column] = value
                        yield (
                            f"rank {rank} row {index} column {column} = {value}",
                            _with(program, rank, changed),
                        )
            yield f"rank {rank} row {index} deleted", _with(program, rank, np.delete(rows, index, axis=0))
            yield (
                f"rank {rank} row {index} repeated",
                _with(program, rank, np.insert(rows, index, rows[index], 0)),
            )
            if index + 1 < len(rows):
                order = [*range(index), index + 1, index, *range(index + 2, len(rows))]
                yield f"rank {rank} rows {index} and {index + 1} swapped", _with(program, rank, rows[order])


def _with(program: DeviceProgram, rank: int, rows: np.ndarray) -> DeviceProgram:
    tables = tuple(rows if r == rank else t for r, t in enumerate(program.rows))
    return dataclasses.replace(program, rows=tables)


FAST = {"ring 3 staged", "stragglar 4 direct"}  # the rest in the slow tier (about 2 s each)


@pytest.mark.parametrize(
    "name", [n if n in FAST else pytest.param(n, marks=pytest.mark.slow) for n in programs()]
)
def test_every_single_change_the_prover_accepts_still_sums_right(name: str) -> None:
    program = programs()[name]
    assert refusal(program) is None and all(sums_right(program, seed, calls=2) for seed in range(ORDERS))
    accepted = refused = 0
    for change, changed in changes(program):
        if refusal(changed) is not None:
            refused += 1
            continue
        accepted += 1
        for seed in range(ORDERS):
            try:
                right = sums_right(changed, seed, calls=2)
            except (AssertionError, KeyError, IndexError) as failed:
                pytest.fail(f"{name}, {change}: accepted, and its run failed: {failed!r}")
            assert right, f"{name}, {change}: accepted, and it sums wrong (order {seed})"
    assert accepted > 0 and refused > 0, (accepted, refused)
