"""The model room as a whole: it imports, prices and decides on a machine without torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from torch_hidden import HIDE_TORCH

# Runs in a fresh interpreter, where torch and CuPy cannot be imported: every module of the
# model room imports, and the DDP policy decides from figures alone.
HIDDEN = HIDE_TORCH + textwrap.dedent(
    """
    import importlib, pkgutil, sys

    try:
        import torch
    except ImportError:
        pass
    else:
        raise SystemExit("the blocker let torch through")

    import stragglar.model
    for found in pkgutil.walk_packages(stragglar.model.__path__, "stragglar.model."):
        importlib.import_module(found.name)

    from stragglar.model import PAPER_NETWORK, compare_generated, resolve_chunks
    from stragglar.model.policy import Outlook, choose

    late = Outlook(2, 0.005, 1.0, (0.005,), ring=PAPER_NETWORK, ours=PAPER_NETWORK)
    print(choose("stragglar", 8, 2**30, late, chunks="auto"))
    print(resolve_chunks("auto", 8, 2**30, 0.005, PAPER_NETWORK))
    print(round(compare_generated(8, 2**30, 0.01).speedup("stragglar"), 2))
    print(sorted(m for m in sys.modules if m.partition(".")[0] in ("torch", "cupy")))
    """
)


def test_the_model_room_imports_and_decides_with_torch_hidden() -> None:
    done = subprocess.run(
        [sys.executable, "-c", HIDDEN], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "Choice(algorithm='stragglar', straggler=2, chunks=38)",
        "38",
        "1.36",
        "[]",
    ]
