"""A training script written as PyTorch's documentation shows ends cleanly: DDP with the hook, then
a bare ``destroy_process_group()`` (no barrier, no release_graphs, no close), 4 gloo ranks.

Before teardown was handled, the auto policy's last probe gather was still in flight when the
group went, and gloo aborted the process ("terminate called without an active exception") in
about one run in four under torchrun.  Each run is a fresh set of processes: the abort happens
at exit.  A run trains two models, one under each policy (the auto policy's state has a probe,
the stragglar policy's with ``detect`` a probe and worker threads); the stragglar model steps
last, so that its probe and its workers are what may be in flight at the destroy.  CI runs 1
(the slow tier; the first test checks what they race on, deterministically), ``pytest -m
manual`` 15."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from script_ranks import start_ranks

pytest.importorskip("torch")

RANKS = 4

SCRIPT = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from stragglar.ddp import StragglarState, stragglar_hook

dist.init_process_group("gloo")
torch.manual_seed(0)
models = []
for policy in ("auto", "stragglar"):  # the stragglar model steps last: its probe and workers
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]), bucket_cap_mb=0.01)
    state = StragglarState(policy=policy, detect=2 if policy == "stragglar" else 0)
    model.register_comm_hook(state, stragglar_hook)
    models.append((model, torch.optim.SGD(model.parameters(), lr=0.01)))
for _ in range(6):
    for model, optimizer in models:
        optimizer.zero_grad()
        model(torch.randn(8, 64)).sum().backward()
        optimizer.step()
dist.destroy_process_group()
print("ended")
"""


def destroying_rank(rank: int, n: int) -> dict[str, bool]:
    """Train with the auto policy, then destroy the probe's group as a script's bare
    destroy_process_group() would destroy every group: what torch's own destroy found."""
    import torch
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d
    from torch.nn.parallel import DistributedDataParallel as DDP

    from stragglar.ddp import StragglarState, stragglar_hook

    seen: dict[str, bool] = {}
    torch_s = c10d.destroy_process_group

    def destroy_process_group(group: object = None) -> None:  # torch's, as the hook's wrapper finds it
        seen["gather in flight"] = state.probe is not None and state.probe.pending
        seen["workers alive"] = any(t.is_alive() for t in threads)
        torch_s(group)  # type: ignore[arg-type]

    c10d.destroy_process_group = destroy_process_group  # before the hook wraps it
    dist.destroy_process_group = destroy_process_group
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)]), bucket_cap_mb=0.001)
    state = StragglarState(policy="stragglar", detect=2)  # the probe, and the worker threads
    model.register_comm_hook(state, stragglar_hook)
    for _ in range(3):
        model(torch.randn(2, 16)).sum().backward()
    connection = state.resources.connection
    assert connection is not None and connection.worker is not None and state.probe is not None
    threads = connection.worker.threads
    seen["gather in flight before"] = state.probe.pending
    dist.destroy_process_group(state.probe.group)  # the wrapper finishes the state's work first
    return seen


def test_the_hook_s_work_ends_before_torch_destroys_a_group() -> None:
    """Deterministic, where the runs below are a race: torch's destroy finds no probe gather in
    flight and no worker thread alive (both were, before it was called)."""
    from stragglar.measure.launch import launch

    seen = launch(destroying_rank, 2, timeout=60)
    wanted = {"gather in flight before": True, "gather in flight": False, "workers alive": False}
    assert seen == [wanted] * 2


def train(script: Path) -> tuple[int, str]:
    """One run of the script under torchrun on RANKS processes: its exit code and output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={RANKS}"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([*command, str(script)], env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize(
    "runs", [pytest.param(1, marks=pytest.mark.slow), pytest.param(15, marks=pytest.mark.manual)]
)
def test_a_bare_destroy_process_group_ends_every_run_cleanly(tmp_path: Path, runs: int) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    failed = []
    for run in range(runs):
        code, output = train(script)
        if code != 0 or output.count("ended") != RANKS:
            failed.append((run, code, output[-2000:]))
    assert not failed, f"{len(failed)} of {runs} runs failed; the first: {failed[0]}"


SILENT_PEER = """
import os, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from stragglar.ddp import StragglarState, stragglar_hook

dist.init_process_group("gloo")
model = DDP(torch.nn.Linear(16, 4))
model.register_comm_hook(StragglarState(policy="auto", timeout=2), stragglar_hook)
try:
    for step in range(5):
        if step == 3 and dist.get_rank() == 2:
            time.sleep(600)  # alive, silent
        model(torch.randn(8, 16)).sum().backward()
except Exception as e:
    print("failed:", str(e).splitlines()[0], flush=True)
dist.destroy_process_group()
print("ended", flush=True)
"""


@pytest.mark.slow  # 3 processes, a 2 s timeout: about 15 s
def test_a_silent_peer_under_auto_lets_the_others_end_cleanly(tmp_path: Path) -> None:
    """The engine's all_reduce (policy="auto") on the process group, whose gloo timeout is 30
    minutes, stayed in flight after the state's timeout failed the step: the other ranks' destroy
    waited 20 s, then their interpreters hung at exit until the silent peer came back, and
    aborted ("terminate called without an active exception")."""
    script = tmp_path / "silent.py"
    script.write_text(SILENT_PEER)
    ranks = start_ranks(script, 3)
    try:
        for rank in (0, 1):
            output, _ = ranks[rank].communicate(timeout=90)
            said = output.splitlines()
            assert ranks[rank].returncode == 0, output
            assert said[-1] == "ended" and "terminate called" not in output, output
            failure = next(line for line in said if line.startswith("failed:"))
            words = f"rank {rank} timed out in the engine's all_reduce waiting for rank 2: no answer within"
            assert f"{words} 2 s (the state's timeout); rank 2 had not reached it" in failure, failure
        assert ranks[2].poll() is None  # still silent: the others did not wait for it
    finally:
        for process in ranks:
            process.kill()
            process.communicate()


GAVE_UP = """
import sys, time
from pathlib import Path
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from stragglar.ddp import StragglarState, stragglar_hook
from stragglar.ddp.probe import LateRankProbe

ended = Path(sys.argv[1])
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Linear(16, 4))
probe = LateRankProbe(2, 4, 600.0)  # its gather waits for the peer, not the state's 2 s
model.register_comm_hook(StragglarState(policy="auto", timeout=2, probe=probe), stragglar_hook)
try:
    for step in range(3):
        if step == 2 and dist.get_rank() == 1:  # gave its step up (a peer lost), and is alive yet
            deadline = time.monotonic() + 60
            while not ended.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            raise RuntimeError("gave up")
        model(torch.randn(8, 16)).sum().backward()
except Exception as e:
    print("failed:", str(e).splitlines()[0], flush=True)
begun = time.monotonic()
dist.destroy_process_group()
print(f"destroyed in {time.monotonic() - begun:.1f} s", flush=True)
print("ended", flush=True)
ended.touch()
"""


@pytest.mark.slow  # 2 processes, a 2 s timeout: about 8 s
def test_a_failed_step_s_calls_that_a_peer_gave_up_end_at_the_destroy(tmp_path: Path) -> None:
    """Deterministic, where a rank SIGKILLed among four is a race: a step failed on rank 0, and its
    peer, alive, will answer none of the calls still in flight (the probe's last gather, the
    engine's all_reduce), as a survivor whose own call failed on a dead rank's connection.  The
    destroy waited CLOSE_WAIT (10 s) for the gather, gave up, and left the calls to end as the
    interpreter exited, when the peer's exit closed their connections: the process aborted
    ("terminate called after throwing an instance of 'gloo::IoException'", every run here; "...
    without an active exception" with a dead rank, now and then).  Now the hook severs its groups
    at once after a failure: the calls end at the destroy, and so do the peer's."""
    script = tmp_path / "gave_up.py"
    script.write_text(GAVE_UP)
    ranks = start_ranks(script, 2, str(tmp_path / "ended"))
    try:
        output, _ = ranks[0].communicate(timeout=90)
        said = output.splitlines()
        assert ranks[0].returncode == 0 and "terminate called" not in output, output
        assert said[-1] == "ended" and "failed: " in output, output
        took = next(float(line.split()[2]) for line in said if line.startswith("destroyed in"))
        assert took < 3.0, output
        assert ranks[1].communicate(timeout=60)[1] is None and ranks[1].returncode == 0
    finally:
        for process in ranks:
            process.kill()
            process.communicate()


REGISTERED = """
import sys
import torch
import torch.distributed as dist
from stragglar.runtime import distributed, register_buffer
from stragglar.runtime.device.shared import Registration

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
group = dist.new_group([0])
tensor = torch.zeros(4)
# no GPU here: the registration is made by hand, and register_buffer's own steps run
made = Registration(group, 1, (tensor.data_ptr(), 4, "float32", 0), (tensor.data_ptr(),), tensor, (), None)
distributed.check_device_buffer = lambda data: None
distributed.launcher = lambda: None
distributed.register = lambda *args: made
assert register_buffer(tensor, group) is made and made.open
dist.destroy_process_group(group)
print("closed" if not made.open else "open")
dist.destroy_process_group()
"""


def test_a_registration_left_open_is_closed_before_torch_destroys_its_group(tmp_path: Path) -> None:
    """A script that registers a buffer and never closes it: ``destroy_process_group(group)``
    closes the registration first (its peers' memory let go, its buffer no longer held)."""
    assert one_process(REGISTERED, tmp_path) == ["closed"]


NEVER_DESTROYED = """
import sys
import torch.distributed as dist
from stragglar.runtime.teardown import before_destroy

class Owner:
    pass

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
owner = Owner()
before_destroy(owner, (dist.new_group([0]),), lambda _: print("finished", flush=True))
print("trained", flush=True)
"""


def test_what_waits_for_a_group_to_go_runs_at_exit_where_no_group_is_destroyed(tmp_path: Path) -> None:
    """A script that never calls destroy_process_group(): the work registered (the probe's last
    gather, the hook's threads) runs as the interpreter exits, before torch's groups go with it
    (a run in a dozen or so of the auto policy aborted at exit without it)."""
    assert one_process(NEVER_DESTROYED, tmp_path) == ["trained", "finished"]


def one_process(script: str, tmp_path: Path) -> list[str]:
    """The words ``script`` printed, run as a world of one gloo rank (its store in ``tmp_path``);
    it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


STATES = """
import sys
import torch.distributed as dist
from stragglar.runtime import distributed
from stragglar.runtime.device import states
from stragglar.runtime.torch_dist import TorchEngine

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
group = dist.new_group([0])
kept = distributed._device_states(TorchEngine(group, False, None), None)
kept["a setup"] = object()  # a state, as a call on the group keeps it
again = distributed._device_states(TorchEngine(group, False, None), None)
world = distributed._device_states(TorchEngine(None, False, None), None)
world["a setup"] = object()
dist.destroy_process_group(group)
print(again is kept, len(kept), (group, None) in states._kept, len(world))
dist.destroy_process_group()
print(len(world), len(states._kept))
"""


def test_a_torch_group_s_device_states_go_before_torch_destroys_it(tmp_path: Path) -> None:
    """The device engine's states on a torch group (each holds an inbox about its buffer's size,
    and the peers' memory it opened) are let go as torch destroys the group, the world's as it
    destroys the world; a group's others stay."""
    assert one_process(STATES, tmp_path) == ["True", "0", "False", "1", "0", "0"]
