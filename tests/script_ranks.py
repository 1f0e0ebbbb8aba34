"""A script started as the ranks of a torch.distributed job, each a process of its own.

For tests that must stop or kill a rank (SIGSTOP, a rank that never comes back), which the
launcher of ``stragglar.measure`` cannot: each rank runs ``script`` with ``args`` under the
environment torchrun would give it (a free port on 127.0.0.1 for the rendezvous), its output
and errors in one pipe.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["start_ranks"]


def start_ranks(script: Path, size: int, *args: str) -> list[subprocess.Popen[str]]:
    """``size`` processes running ``script`` as ranks 0..size-1 of one job."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    env = dict(
        os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(size), OMP_NUM_THREADS="1"
    )
    return [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            env={**env, "RANK": str(rank)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(size)
    ]
