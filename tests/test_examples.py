"""The shipped examples run as the README starts them: the DDP one with ``torchrun`` with 2 gloo ranks
on 127.0.0.1, and on two "nodes": two ``torchrun --nnodes=2`` on this machine, meeting at a c10d
rendezvous; the HSDP one on 4 gloo ranks, 2 replicas x 2 shards."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "ddp_torchrun.py"
HSDP_EXAMPLE = ROOT / "examples" / "hsdp_torchrun.py"
ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+(-?[\d.]+)\s+(-?[\d.]+)$")
VERDICT = re.compile(
    r"^policy (\w+): StragglAR at (\d+) of (\d+) steps(?:, (\d+) more in part)? "
    r"\(bucket reductions: (\d+) of (\d+)\)$",
    re.MULTILINE,
)
LIMIT = 180  # seconds: a bound against a hang (a run takes about 10-20 s on 2 busy cores)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launched(*launcher: str) -> subprocess.Popen[str]:
    """``torch.distributed.run`` with ``launcher``'s arguments (the example's last), started in a
    session of its own, so that killing its process group kills its workers too."""
    command = [sys.executable, "-m", "torch.distributed.run", *launcher]
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def finished(procs: list[subprocess.Popen[str]]) -> list[str]:
    """Each launcher's output, once all exit 0; all are killed, workers too, if any is not done
    within ``LIMIT`` seconds (in all), and whatever is left when the test ends."""
    deadline = time.monotonic() + LIMIT
    outputs = []
    try:
        for proc in procs:
            try:
                out, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the example did not finish within {LIMIT} s")
            assert proc.returncode == 0, err
            outputs.append(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
    return outputs


def torchrun(*args: str) -> str:
    """Rank 0's output, from 2 ranks on one node."""
    addresses = ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    [out] = finished([launched("--nnodes=1", "--nproc-per-node=2", *addresses, str(EXAMPLE), *args)])
    return out


@pytest.mark.parametrize(
    ("policy", "first", "share"),
    [
        # the engine until a window of steps is in, and at 2 ranks for good (the model never
        # prefers StragglAR below 4; the hook's tests cover auto's choices)
        pytest.param("auto", "(1, 'allreduce', None, None)", 0, marks=pytest.mark.slow),
        ("stragglar", "(1, 'stragglar', 1, None)", 1),  # every bucket, rank 1 the straggler
    ],
)
def test_the_ddp_example_trains_both_copies_alike_and_prints_the_decisions(
    policy: str, first: str, share: int
) -> None:
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
    worst = re.search(r"parameters: (\S+) \(at most 1e-06\)$", out, re.MULTILINE)
    assert worst is not None and float(worst.group(1)) < 1e-6, out  # else the example exits 1
    verdict = VERDICT.search(out)
    assert verdict is not None and verdict.group(1) == policy, out
    every, steps_, some, done, total = (int(g or 0) for g in verdict.group(2, 3, 4, 5, 6))
    assert (every, steps_, some) == (share * steps, steps, 0), out
    assert total >= steps and done == share * total, out  # one bucket or more a step


def test_the_ddp_example_refuses_the_device_engine_off_nccl_in_one_line() -> None:
    """Before it joins a job: gloo buckets are on the CPU, where the device engine does not run."""
    args = [sys.executable, str(EXAMPLE), "--backend", "gloo", "--engine", "device"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=LIMIT, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr
        == "ddp_torchrun.py: error: --engine device reduces CUDA tensors: it runs on NCCL, with CUDA GPUs\n"
    )


@pytest.mark.parametrize(
    ("example", "args", "said"),
    [
        (EXAMPLE, ["--steps", "0"], "argument --steps: must be at least 1, got 0"),
        (EXAMPLE, ["--width", "x"], "argument --width: 'x' is not a whole number"),
        (EXAMPLE, ["--delay", "50"], "argument --delay: '50' needs a unit: write 50ms or 50s (or us)"),
        (EXAMPLE, ["--late-rank", "1"], "--late-rank and --delay go together"),
        (EXAMPLE, ["--delay", "5ms"], "--late-rank and --delay go together"),
        (HSDP_EXAMPLE, ["--replicas", "0"], "argument --replicas: must be at least 1, got 0"),
        (HSDP_EXAMPLE, ["--width", "6"], "--width must be a multiple of the 4 attention heads, got 6"),
    ],
)
def test_an_example_refuses_a_bad_option_in_one_line_before_it_joins_a_job(
    example: Path, args: list[str], said: str
) -> None:
    """Each ended in a traceback on every rank (no median of 0 steps; a zero-width layer), or ran
    with an option that did nothing (a late rank 0 ms late)."""
    done = subprocess.run(
        [sys.executable, str(example), *args], capture_output=True, text=True, timeout=LIMIT
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and done.stdout == "" and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith(f"{example.name}: error: {said}"), lines[-1]


def test_an_example_started_without_torchrun_says_so_in_one_line() -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True, timeout=LIMIT)
    assert done.returncode == 2 and done.stdout == ""
    assert (
        done.stderr == "ddp_torchrun.py: error: start it with torchrun, which starts its ranks: "
        "torchrun --nproc-per-node=N <script>\n"
    )


@pytest.mark.slow
def test_the_ddp_example_runs_on_two_nodes_met_at_a_c10d_rendezvous() -> None:
    """As on a cluster (the README's command), but both "nodes" on 127.0.0.1, 2 gloo ranks each."""
    port = free_port()
    rendezvous = [
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=stragglar-test-{port}",
    ]
    example = [str(EXAMPLE), "--backend", "gloo", "--steps", "6"]
    outputs = finished([launched(*rendezvous, f"--node-rank={k}", *example) for k in (0, 1)])
    # c10d numbers the nodes in its own order (by host and process id), not by --node-rank: the
    # node that got global rank 0 prints the report, the other nothing
    reports = [out for out in outputs if out.strip()]
    assert len(reports) == 1, outputs
    [out] = reports
    assert out.splitlines()[0] == "4 ranks on gloo, MLP 6 x 512", out
    verdict = VERDICT.search(out)
    assert verdict is not None and verdict.group(1, 3) == ("auto", "6"), out


HSDP_ROW = re.compile(r"^\s*(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")


@pytest.mark.slow
def test_the_hsdp_example_trains_native_hsdp_and_the_hook_alike() -> None:
    """4 gloo ranks, 2 replicas x 2 shards, rank 3 late: StragglAR reduces every shard across the
    replicas, replica 1 the straggler, and both copies' losses match at every step."""
    steps = 4
    addresses = ["--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    args = [
        "--backend",
        "gloo",
        "--policy",
        "stragglar",
        "--steps",
        str(steps),
        "--width",
        "32",
        "--depth",
        "2",
    ]
    late = ["--late-rank", "3", "--delay", "20ms"]
    launcher = ("--nnodes=1", "--nproc-per-node=4", *addresses, str(HSDP_EXAMPLE), *args, *late)
    [out] = finished([launched(*launcher)])
    lines = out.splitlines()
    assert (
        lines[0]
        == "4 ranks on gloo: 2 replicas x 2 shards, transformer 2 x 32, rank 3 (replica 1) late by 20 ms"
    )
    assert lines[1:3] == [
        'decisions of policy="stragglar" (step, algorithm, straggler replica, chunks):',
        "  (1, 'stragglar', 1, None)",
    ]
    rows = [m.groups() for m in map(HSDP_ROW.match, lines) if m]
    assert [int(r[0]) for r in rows] == list(range(1, steps + 1)), out  # rank 0 alone prints
    for _, t_native, t_ours, loss_native, loss_ours in rows:
        assert float(t_native) > 0 and float(t_ours) > 0
        assert float(loss_ours) == pytest.approx(float(loss_native), rel=1e-5)
    assert re.search(
        r"^rank 0: the losses match: largest relative difference \S+ \(at most 1e-05\)$", out, re.MULTILINE
    ), out


@pytest.mark.parametrize(
    ("args", "code"), [(["--steps", "0"], 2), (["--backend", "gloo", "--engine", "device"], 2), (["-h"], 0)]
)
def test_only_rank_0_of_a_job_says_why_an_option_is_refused(args: list[str], code: int) -> None:
    """Under torchrun every rank read the same options and printed the same error (or help), once
    per rank: rank 0 says it, every rank exits as argparse does."""
    said = {}
    for rank in ("0", "1"):
        env = {**os.environ, "RANK": rank}
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=LIMIT, env=env
        )
        assert done.returncode == code, done.stderr
        said[rank] = done.stdout + done.stderr
    assert said["1"] == ""
    assert (
        said["0"].startswith("usage: ddp_torchrun.py")
        if code == 0
        else "ddp_torchrun.py: error: " in said["0"]
    )


def test_a_rank_whose_node_has_no_gpu_says_so_itself() -> None:
    """A problem of a rank's own node (no CUDA for NCCL) is said by every rank that has it: rank 0's
    node may have GPUs, and rank 1 exited 2 without a word."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this node has CUDA GPUs")
    env = {**os.environ, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--backend", "nccl"],
        capture_output=True,
        text=True,
        timeout=LIMIT,
        env=env,
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert (
        done.stderr
        == "ddp_torchrun.py: error: --backend nccl needs CUDA GPUs: torch sees none on this node\n"
    )
