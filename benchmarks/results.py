"""Saving a benchmark's figures: one JSON document that says when and on what they were measured."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

from stragglar.files import write_text
from stragglar.measure.sweep import machine


def save(path: Path, figures: dict[str, object]) -> None:
    """Write ``figures`` to ``path`` (atomically) with the date and the machine."""
    doc = {"date": date.today().isoformat(), "machine": machine(), **figures}
    write_text(path, json.dumps(doc, indent=2) + "\n")
