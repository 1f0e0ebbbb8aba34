"""Schedules and documents the JSON format's tests share: hand-built schedules (every field and
metadata value the format holds), a valid document to break, and the shipped JSON Schema."""

from __future__ import annotations

import importlib.resources
import json
from collections.abc import Callable
from typing import Any

import jsonschema

from stragglar.formats.schedule_json import dumps
from stragglar.schedule import Op, Phase, Schedule, Transfer

C, R = Op.COPY, Op.REDUCE


def stragglar4() -> Schedule:
    """4 ranks, 3 chunks, straggler 3: a hidden phase without it, then one with it."""
    hidden = Phase(
        "reduce-scatter",
        (0, 1, 2),
        (
            (Transfer(0, 1, 0, R), Transfer(1, 2, 1, R), Transfer(2, 0, 2, R)),
            (Transfer(1, 0, 2, R), Transfer(2, 1, 0, R)),
        ),
    )
    exposed = Phase(
        "allreduce",
        (3, 0, 1, 2),
        (
            (Transfer(3, 0, 0, R), Transfer(0, 3, 1, C), Transfer(1, 2, 2, C)),
            (),
            (Transfer(2, 3, 2, C), Transfer(3, 1, 0, C)),
        ),
    )
    metadata = {
        "generator": "hand-built",
        "params": {"n": 4, "hidden": True, "weights": [0.5, -1.25e-3]},
        "note": None,
        "name": "ñ ✓",
    }
    return Schedule("stragglar", 4, 3, 3, (hidden, exposed), metadata=metadata)


def ring2() -> Schedule:
    return Schedule("ring", 2, 1, None, (Phase("ring", (0, 1), ((Transfer(1, 0, 0, C),),)),))


def lonely() -> Schedule:
    """Two ranks (one has nothing to reduce: the format refuses it), no phases, empty metadata:
    the smallest valid document, though no AllReduce."""
    return Schedule("direct", 2, 1, None, ())


SCHEDULES = [stragglar4(), ring2(), lonely()]


def same(a: Schedule, b: Schedule) -> bool:
    """Equal including metadata (which ``Schedule.__eq__`` ignores) and op types."""
    ops_a = [type(t.op) for _, _, t in a.transfers()]
    ops_b = [type(t.op) for _, _, t in b.transfers()]
    return a == b and dict(a.metadata) == dict(b.metadata) and ops_a == ops_b


def load_schema() -> dict[str, Any]:
    resource = importlib.resources.files("stragglar.formats").joinpath("schedule.schema.json")
    schema: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return schema


SCHEMA = load_schema()


VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


Mutation = Callable[[dict[str, Any]], None]


def at(doc: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def valid_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(dumps(stragglar4()))
    return doc
