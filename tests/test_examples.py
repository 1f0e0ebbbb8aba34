"""The shipped example runs as the README starts it: ``torchrun`` with 2 gloo ranks on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_torchrun.py"
ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)$")
LIMIT = 180  # seconds: a bound against a hang (a run takes about 10-20 s on 2 busy cores)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(*args: str) -> str:
    """Rank 0's output; the whole process group is killed if it does not finish in time."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--master-addr=127.0.0.1",
        f"--master-port={free_port()}",
        str(EXAMPLE),
        *args,
    ]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"the example did not finish within {LIMIT} s")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    return out


@pytest.mark.parametrize(
    ("policy", "first"),
    [
        # the engine until a window of steps is in (the hook's tests cover auto's choices)
        pytest.param("auto", "(1, 'allreduce', None, None)", marks=pytest.mark.slow),
        ("stragglar", "(1, 'stragglar', 1, None)"),  # every bucket, rank 1 the straggler
    ],
)
def test_the_ddp_example_trains_both_copies_alike_and_prints_the_decisions(policy: str, first: str) -> None:
    steps = 5
    args = ["--backend", "gloo", "--policy", policy, "--steps", str(steps), "--width", "32"]
    out = torchrun(*args, "--late-rank", "1", "--delay", "20ms")
    lines = out.splitlines()
    assert lines[0] == "2 ranks on gloo, MLP 6 x 32, rank 1 late by 20 ms", out
    assert lines[1] == f'decisions of policy="{policy}" (step, algorithm, straggler, chunks):'
    assert lines[2] == f"  {first}", out
    rows = [m.groups() for m in map(ROW.match, lines) if m]
    assert [int(r[0]) for r in rows] == list(range(1, steps + 1)), out  # rank 0 alone prints
    for _, t_default, t_ours, loss_default, loss_ours in rows:
        assert float(t_default) > 0 and float(t_ours) > 0
        assert float(loss_ours) == pytest.approx(float(loss_default), rel=1e-5, abs=1e-6)
    worst = re.search(r"parameters: (\S+)$", out, re.MULTILINE)
    assert worst is not None and float(worst.group(1)) < 1e-5, out
