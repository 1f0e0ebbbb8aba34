"""FSDP2's all-reduce hook on 4 gloo ranks, 2 replicas x 2 shards: after several steps the gradients
and parameters are native HSDP's (``fully_shard`` on the 2-D mesh), with nobody late and with a
late replica, with a divide factor too; ``auto`` uses the engine when nobody is late and StragglAR
for a late replica; what the hook cannot serve is refused in one sentence."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("torch")

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, ShardPlacementResult
from torch.distributed.tensor import DTensor, Shard

from stragglar.ddp import StragglarState
from stragglar.errors import ArgumentError, InputError
from stragglar.formats.traces import Columns, read_trace
from stragglar.fsdp import use_stragglar
from stragglar.measure.launch import LaunchError, launch
from stragglar.model import Network
from stragglar.model.detect import Rule
from stragglar.model.policy import PROBE_LAG

SLOW = Network(0.0, 500.0)  # bandwidth-bound: StragglAR never pays at 2 replicas
DEAR = Network(0.5, 1e12)  # 0.5 s rounds: at 4 replicas StragglAR pays above 0.15 s of lateness
SIZES = (13, 40, 29, 6)  # 29 rows: FSDP pads the shards of the second layer unevenly


def mesh(replicas: int = 2) -> DeviceMesh:
    """The 4 ranks as ``replicas`` replicas of 4 / ``replicas`` shards (rank = replica x shards + shard)."""
    return init_device_mesh("cpu", (replicas, 4 // replicas), mesh_dim_names=("replicate", "shard"))


def layers() -> torch.nn.Sequential:
    torch.manual_seed(0)  # the same weights on every rank, in both copies
    a, b, c, d = SIZES
    return torch.nn.Sequential(
        torch.nn.Linear(a, b), torch.nn.Tanh(), torch.nn.Linear(b, c), torch.nn.Tanh(), torch.nn.Linear(c, d)
    )


def linears(model: torch.nn.Module) -> list[Any]:
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


def sharded(model: torch.nn.Sequential, on: DeviceMesh) -> torch.nn.Sequential:
    for layer in linears(model):
        fully_shard(layer, mesh=on)
    fully_shard(model, mesh=on)
    return model


def twins(
    state: StragglarState, factor: float | None = None, replicas: int = 2
) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same model twice: native HSDP on the 2-D mesh, and sharded over the shard dimension with
    the StragglAR hook across the replicas (``factor``: both with that gradient divide factor, and
    sums only, so that FSDP divides after the reductions)."""
    torch.set_num_threads(1)
    grid = mesh(replicas)
    native, ours = sharded(layers(), grid), sharded(layers(), grid["shard"])
    assert use_stragglar(ours, state, replicate_group=grid["replicate"].get_group()) == 3
    if factor is not None:
        for model in (native, ours):
            for layer in linears(model):
                layer.set_gradient_divide_factor(factor)
                layer.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM
    return native, ours


def local(tensor: Any) -> torch.Tensor:
    assert isinstance(tensor, DTensor)
    return tensor.to_local()


def train(
    rank: int, native: torch.nn.Module, ours: torch.nn.Module, steps: int, pause: Callable[[], None] | None
) -> float:
    """``steps`` SGD steps of both copies on this rank's own data, ``pause`` called before our
    copy's backward; returns the largest difference of gradients and parameters (asserted close)."""
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (native, ours)]
    worst = 0.0
    for step in range(steps):
        gen = torch.Generator().manual_seed(100 * rank + step)  # each rank its own batch
        x, y = torch.randn(8, SIZES[0], generator=gen), torch.randn(8, SIZES[-1], generator=gen)
        for model, optimizer in zip((native, ours), optimizers, strict=True):
            optimizer.zero_grad()
            loss = (model(x) - y).square().mean()
            if model is ours and pause is not None:
                pause()
            loss.backward()
        for a, b in zip(native.parameters(), ours.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None and local(a.grad).abs().sum() > 0
            torch.testing.assert_close(local(b.grad), local(a.grad), rtol=1e-5, atol=1e-6)
            worst = max(worst, float((local(a.grad) - local(b.grad)).abs().max()))
        for optimizer in optimizers:
            optimizer.step()
        for a, b in zip(native.parameters(), ours.parameters(), strict=True):
            torch.testing.assert_close(local(b), local(a), rtol=1e-5, atol=1e-6)
            worst = max(worst, float((local(a) - local(b)).abs().max()))
    return worst


def late_replica(rank: int, delay: float, replicas: int = 2) -> Callable[[], None] | None:
    """The last replica (every shard of it: ranks 2 and 3 of 2 replicas) sleeps ``delay`` before
    its backward."""
    last = rank // (4 // replicas) == replicas - 1
    return functools.partial(time.sleep, delay) if last and delay else None


def hsdp_rank(
    rank: int, n: int, options: dict[str, Any], delay: float, factor: float | None
) -> tuple[float, list[Any]]:
    state = StragglarState(timeout=20, **options)
    native, ours = twins(state, factor)
    worst = train(rank, native, ours, 6, late_replica(rank, delay))
    return worst, list(state.decisions)


CASES = {  # options, replica 1's delay (s), the divide factor, the decision (algorithm, straggler, chunks)
    "nobody late": ({}, 0.0, None, ("stragglar", 1, None)),
    "a late replica": ({"straggler": 1}, 0.05, None, ("stragglar", 1, None)),
    "in chunks, divided by 3": ({"chunks": 3}, 0.0, 3.0, ("stragglar", 1, 3)),
    "the engine, divided by 3": ({"policy": "auto", "network": SLOW}, 0.0, 3.0, ("allreduce", None, None)),
}


@pytest.mark.parametrize("case", CASES)
def test_the_gradients_and_parameters_are_native_hsdps(case: str) -> None:
    options, delay, factor, decision = CASES[case]
    results = launch(hsdp_rank, 4, (options, delay, factor), timeout=60)
    assert max(worst for worst, _ in results) < 1e-5
    decisions = {tuple(map(tuple, d)) for _, d in results}
    assert len(decisions) == 1, decisions  # every rank chose the same for every shard
    assert [(a, s, c) for _, a, s, c in decisions.pop()] == [decision]


def device_rank(rank: int, n: int) -> tuple[float, list[Any], list[bool]]:
    """``engine="device"`` with the device engine stood in by the rounds engine (its kernels need
    a GPU; they are tested on their own): each shard one call, never registered (FSDP hands a new
    shard each step), and the gradients native HSDP's."""
    from unittest import mock

    from stragglar.ddp import hook, worker
    from stragglar.runtime import allreduce as rounds

    engines: list[bool] = []

    def allreduce(data: torch.Tensor, proof: Any, **kwargs: Any) -> Any:
        engines.append(kwargs.pop("engine") == "device")
        return rounds(data, proof, **kwargs)

    def register_buffer(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("FSDP's shards are not kept: nothing registers them")

    with (
        mock.patch.object(hook, "check_bucket", lambda state, buffer, in_call: None),  # CPU shards here
        mock.patch.object(worker, "allreduce", allreduce),
        mock.patch.object(worker, "register_buffer", register_buffer),
    ):
        worst, decisions = hsdp_rank(rank, n, {"engine": "device", "straggler": 1}, 0.02, None)
    return worst, decisions, engines


def test_the_device_engine_reduces_each_shard_in_one_call_staged() -> None:
    results = launch(device_rank, 4, (), timeout=60)
    assert max(worst for worst, _, _ in results) < 1e-5
    calls = {len(engines) for _, _, engines in results}
    assert all(all(engines) for _, _, engines in results) and calls == {6 * 3}  # 6 steps, 3 groups
    assert {tuple(map(tuple, d)) for _, d, _ in results} == {((1, "stragglar", 1, None),)}


# The rule names a replica last at every step within 6 steps at 2 replicas and 4 at 4 with these settings
# (h = ln(2 / 0.05), ln(0.95 * 2) a step; the default's 0.01% false alarms need 25 and 10), seen 2 steps late.
QUICK = Rule(false_alarm=0.05, share=0.95, margin=0.02)
DETECTING_STEPS = 10


def auto_rank(rank: int, n: int, delay: float) -> tuple[float, list[Any]]:
    """4 replicas of 1 shard, judged over windows of 2 steps on a network of dear rounds.  (At 2
    replicas StragglAR saves a round for any lateness, or nothing: no delay is critical there.)"""
    state = StragglarState(policy="auto", detect=2, network=DEAR, timeout=20, rule=QUICK)
    native, ours = twins(state, replicas=4)
    worst = train(rank, native, ours, DETECTING_STEPS, late_replica(rank, delay, replicas=4))
    return worst, list(state.decisions)


@pytest.mark.parametrize("delay", [0.0, pytest.param(0.4, marks=pytest.mark.slow)])
def test_auto_uses_the_engine_unless_a_replica_is_late(delay: float) -> None:
    results = launch(auto_rank, 4, (delay,), timeout=60)
    assert max(worst for worst, _ in results) < 1e-5
    decisions = {tuple(map(tuple, d)) for _, d in results}
    assert len(decisions) == 1, decisions
    (chosen,) = decisions
    assert chosen[0] == (1, "allreduce", None, None)  # until a window of steps is in
    later = {(a, s) for _, a, s, _ in chosen[1:]}
    assert later == ({("stragglar", 3)} if delay else set()), chosen  # replica 3 is the late one


def detecting_rank(rank: int, n: int, path: str) -> tuple[float, list[tuple[int, int]], list[Any]]:
    """Replica 0 (ranks 0 and 1) late by 0.1 s every step; ``detect`` over windows of 2 steps, the
    arrivals recorded."""
    state = StragglarState(detect=2, record=path, timeout=20, rule=QUICK)
    native, ours = twins(state)
    pause = functools.partial(time.sleep, 0.1) if rank < 2 else None
    worst = train(rank, native, ours, DETECTING_STEPS, pause)
    return worst, list(state.switches), list(state.decisions)


def test_detect_and_record_probe_the_replicas(tmp_path: Any) -> None:
    """Each replicate group ({0, 2} and {1, 3}) probes its replicas and finds the late one; the
    world's rank 0 writes its group's trace, one column per replica."""
    path = tmp_path / "trace.jsonl"
    results = launch(detecting_rank, 4, (str(path),), timeout=60)
    assert max(worst for worst, _, _ in results) < 1e-5
    for shard in (0, 1):  # each replicate group decides alike on its own figures (the other's may
        # switch a step apart: they reduce other shards)
        switches = {tuple(results[rank][1]) for rank in (shard, shard + 2)}
        assert len(switches) == 1 and [rank for _, rank in switches.pop()] == [0], results  # replica 0
    assert all(
        d[0] == (1, "stragglar", 1, None) and d[-1][1:] == ("stragglar", 0, None) for _, _, d in results
    )
    (group,) = read_trace(path, "jsonl", Columns(), ())
    # step 1 is not recorded: the ranks had just met (the probe's group, the settings' check)
    assert group.ranks == ("0", "1") and group.steps == tuple(range(2, DETECTING_STEPS - PROBE_LAG + 1))
    assert sum(row[0] > row[1] for row in group.times) >= 3  # replica 0 late


def refusing_rank(rank: int, n: int) -> dict[str, str]:
    """What ``use_stragglar`` says to each thing it cannot serve."""
    torch.set_num_threads(1)
    grid = mesh()
    replicas, shards = grid["replicate"].get_group(), grid["shard"].get_group()
    said: dict[str, str] = {}

    def refused(name: str, error: type[Exception], model: Any, group: Any, state: Any = None) -> None:
        with pytest.raises(error) as caught:
            use_stragglar(model, state or StragglarState(), replicate_group=group)
        said[name] = str(caught.value)

    refused("the world", InputError, sharded(layers(), grid["shard"]), dist.group.WORLD)
    refused("the shard group", InputError, sharded(layers(), grid["shard"]), shards)
    refused("2-D", InputError, sharded(layers(), grid), replicas)
    refused("unsharded", InputError, layers(), replicas)
    refused("no group", ArgumentError, sharded(layers(), grid["shard"]), None)
    refused(
        "another state's group",
        InputError,
        sharded(layers(), grid["shard"]),
        replicas,
        StragglarState(process_group=shards),
    )
    world = init_device_mesh("cpu", (4,))
    elsewhere = ShardPlacementResult(Shard(0), FSDPMeshInfo(world, shard_mesh_dim=0))
    mixed = layers()
    fully_shard(mixed[0], mesh=grid["shard"], shard_placement_fn=lambda p: elsewhere if p.ndim == 1 else None)
    refused("several groups", InputError, mixed, replicas)
    twice = sharded(layers(), grid["shard"])
    use_stragglar(twice, StragglarState(), replicate_group=replicas)
    refused("twice", InputError, twice, replicas)
    straggler = StragglarState(straggler=3)  # a global rank, where the state reads a replica's index
    refused("a global rank as straggler", InputError, sharded(layers(), grid["shard"]), replicas, straggler)
    return said


def test_what_the_hook_cannot_serve_is_refused_in_one_sentence() -> None:
    said = launch(refusing_rank, 4, timeout=60)[1]  # rank 1: shard group {0, 1}, replicas {1, 3}
    assert said["the world"] == (
        "replicate_group is not the replicate group of the shards of module '0': it shares ranks 0, 1 "
        "with the shard group, where a replicate group shares this rank (1) alone"
    )
    assert said["the shard group"] == said["the world"]
    assert said["2-D"].startswith(
        "module '0' is sharded over a 2-D mesh, whose replicas FSDP all-reduces itself"
    )
    assert said["unsharded"].startswith("the module has no parameters sharded with fully_shard")
    assert said["no group"] == (
        "replicate_group must be a torch process group this rank is in, got None (NoneType)"
    )
    assert said["another state's group"].startswith("the state serves another process group")
    assert said["several groups"].startswith("module '0' has 2 parameter groups")
    assert said["twice"].startswith("use_stragglar already serves module '0': call it once")
    assert said["a global rank as straggler"] == (
        "StragglarState.straggler is 3: it is a replica's index in replicate_group, 0..1 "
        "(its global ranks, in order: 1, 3)"
    )
    assert all("\n" not in words for words in said.values())


def crossed_rank(rank: int, n: int) -> None:
    """A 'replicate group' of ranks that hold different shards: {0, 3} and {1, 2}."""
    torch.set_num_threads(1)
    grid = mesh()
    crossed = [dist.new_group([0, 3]), dist.new_group([1, 2])][rank in (1, 2)]
    model = sharded(layers(), grid["shard"])  # {0, 3} meets each shard group once: no rank alone can tell
    use_stragglar(model, StragglarState(timeout=20), replicate_group=crossed)
    model(torch.ones(2, SIZES[0])).sum().backward()


def test_a_group_across_shards_fails_every_rank_alike_at_the_first_step() -> None:
    with pytest.raises(LaunchError) as caught:
        launch(crossed_rank, 4, timeout=30)
    said = (
        "stragglar.runtime.header.MismatchError: "
        "replicate_group's ranks hold different shards, so it is no replicate group"
    )
    first, second = (
        "rank 0 holds shard 0 of 2; rank 3 holds shard 1 of 2",
        "rank 1 holds shard 1 of 2; rank 2 holds shard 0 of 2",
    )
    held = {0: first, 1: second, 2: second, 3: first}
    assert str(caught.value).splitlines()[1:] == [f"  rank {r}: {said}: {held[r]}" for r in range(4)], (
        caught.value
    )


def metrics_rank(rank: int, n: int, path: str) -> int | None:
    rule = Rule(false_alarm=0.05, share=0.95, margin=0.02)
    state = StragglarState(timeout=20, detect=6, rule=rule, metrics=path)
    native, ours = twins(state)
    train(rank, native, ours, 12, late_replica(rank, 0.1))
    return state.persistent_straggler


def test_the_report_names_a_late_replica_by_its_global_rank(tmp_path: Any) -> None:
    """Global rank 0 probes its replicate group, ranks 0 and 2, and the late one is 2 there; the
    log and the metrics called it rank 1, its index in the group (a punctual rank)."""
    path = tmp_path / "stragglar.prom"
    named = launch(metrics_rank, 4, (str(path),), timeout=90)
    assert named == [1, 1, 1, 1]  # the state's own answer stays the group's index
    text = path.read_text(encoding="utf-8")
    assert "stragglar_persistent_straggler 2\n" in text, text
    assert 'stragglar_persistent{rank="2"} 1' in text and 'stragglar_persistent{rank="0"} 0' in text, text
    assert 'rank="1"' not in text and 'rank="3"' not in text, text


def dying_replica_rank(rank: int, n: int, policy: str = "stragglar") -> None:
    """Global rank 3 (replica 1's shard 1) dies at the third step, before its backward."""
    native, ours = twins(StragglarState(timeout=20, policy=policy))

    def die() -> None:
        os._exit(3)

    for i in range(3):
        train(rank, native, ours, 1, die if i == 2 and rank == 3 else None)


def test_a_failure_in_the_replicas_rounds_names_global_ranks_too() -> None:
    """The runtime numbers the replicate group's ranks from 0: rank 1 (global 1) said it lost the
    connection "with rank 1", its group's index of global rank 3, the one that died."""
    with pytest.raises(LaunchError) as info:
        launch(dying_replica_rank, 4, timeout=60)
    said = info.value.errors[1].splitlines()[-1]  # the error's line, after its traceback
    assert "RankError: allreduce failed: rank 0 lost the connection " in said, said
    names = "(ranks of the hook's group: rank 0 is global rank 1, rank 1 is global rank 3)"
    assert said.endswith(names), said


def test_under_auto_the_engine_s_lost_peer_is_named_by_the_roll_call() -> None:
    """gloo's error names an address.  Global rank 1 lost its replica peer, global rank 3, which
    died; global rank 0 lost global rank 2, alive but failed in FSDP's own reduce-scatter with
    rank 3 (its shard peer), so it never reached the all_reduce: each names the one that was not
    in the call, by its global rank too."""
    with pytest.raises(LaunchError) as info:
        launch(dying_replica_rank, 4, ("auto",), timeout=60)
    for rank, peer in ((0, 2), (1, 3)):
        said = info.value.errors[rank].splitlines()[-1]
        assert "RankError: allreduce failed: rank 0 lost the connection in the engine's all_reduce " in said
        assert "; rank 1 had not reached it or had left it (ranks of the hook's group: " in said, said
        assert said.endswith(f"rank 0 is global rank {rank}, rank 1 is global rank {peer})"), said


def partly_served_rank(rank: int, n: int, when: str) -> None:
    """The hook given the first layer only, or the model before its root was sharded: the root's
    parameters had no all-reduce across the replicas, and the replicas drifted apart silently."""
    torch.set_num_threads(1)
    grid = mesh()
    model = layers()
    replicas = grid["replicate"].get_group()
    if when == "a submodule":
        use_stragglar(sharded(model, grid["shard"])[0], StragglarState(timeout=20), replicate_group=replicas)
    else:
        for layer in linears(model)[:2]:  # the last layer's parameters are the root's
            fully_shard(layer, mesh=grid["shard"])
        use_stragglar(model, StragglarState(timeout=20), replicate_group=replicas)
        fully_shard(model, mesh=grid["shard"])  # after the hook: the root's group is no one's
    model(torch.ones(2, SIZES[0])).sum().backward()


@pytest.mark.parametrize(
    ("when", "unserved"), [("a submodule", "module '2'"), ("before the root was sharded", "the module")]
)
def test_a_parameter_group_the_hook_does_not_serve_is_refused_at_the_first_step(
    when: str, unserved: str
) -> None:
    with pytest.raises(LaunchError) as caught:
        launch(partly_served_rank, 4, (when,), timeout=30)
    said = (
        f"stragglar.errors.InputError: {unserved} is sharded over this rank's shard group and use_stragglar "
        "does not serve it: its gradients would not be reduced across the replicas; call use_stragglar "
        "on the root module, after fully_shard"
    )
    assert [error.splitlines()[-1] for error in caught.value.errors.values()] == [said] * 4, caught.value


def other_model_rank(rank: int, n: int, policy: str) -> None:
    """Replica 1 (ranks 2 and 3) builds a wider first layer: the replicas reduce other shards."""
    torch.set_num_threads(1)
    grid = mesh()
    torch.manual_seed(0)
    width = 40 if rank < 2 else 41
    model = torch.nn.Sequential(torch.nn.Linear(13, width), torch.nn.Tanh(), torch.nn.Linear(width, 6))
    sharded(model, grid["shard"])
    state = StragglarState(timeout=20, policy=policy, network=SLOW if policy == "auto" else None)
    use_stragglar(model, state, replicate_group=grid["replicate"].get_group())
    model(torch.ones(2, 13)).sum().backward()


@pytest.mark.parametrize("policy", ["auto", "stragglar"])
def test_replicas_of_other_models_fail_alike_on_every_rank(policy: str) -> None:
    """Under auto the engine's all_reduce took them, and gloo aborted the processes ("terminate
    called after throwing an instance of 'gloo::EnforceNotMet'")."""
    with pytest.raises(LaunchError) as caught:
        launch(other_model_rank, 4, (policy,), timeout=30)
    errors = caught.value.errors
    assert sorted(errors) == [0, 1, 2, 3], caught.value
    said = "stragglar.runtime.header.MismatchError: HSDP replicas reduce shards of other sizes or dtypes"
    assert all(error.splitlines()[-1].startswith(said) for error in errors.values()), caught.value
    assert "terminate called" not in str(caught.value)


def silent_replica_rank(rank: int, n: int) -> str:
    """Global rank 3 (replica 1's shard 1) is silent for 8 s at the second step, under auto, its
    replicate group's timeout 3 s: rank 1's backward raises the RankError itself."""
    torch.set_num_threads(1)
    native, ours = twins(StragglarState(timeout=3, policy="auto", network=SLOW))
    train(rank, native, ours, 1, None)
    if rank == 3:
        time.sleep(8)  # then on: rank 2 waits for it in FSDP's own reduce-scatter, unbounded
    try:
        ours(torch.ones(2, SIZES[0])).sum().backward()  # ours alone: native HSDP would wait 30 minutes
    except Exception as e:  # what a training loop would catch
        return f"{type(e).__name__}: {str(e).splitlines()[0]} ({len(str(e).splitlines())} lines)"
    return "no error"


def test_the_engine_s_failure_reaches_fsdp_s_caller_as_the_rank_error_itself() -> None:
    """It came as torch's RuntimeError, "Got the following error when running the callback: ...",
    then 20 lines of the callback's stack: ``except RankError`` did not catch it."""
    said = launch(silent_replica_rank, 4, timeout=90)
    assert said[1] == (  # the roll call names the replica that never came (stragglar/runtime/roll_call.py)
        "RankError: allreduce failed: rank 0 timed out in the engine's all_reduce waiting for rank 1: no "
        "answer within 3 s (the state's timeout); rank 1 had not reached it (ranks of the hook's group: "
        "rank 0 is global rank 1, rank 1 is global rank 3) (1 lines)"
    ), said
    # rank 2 waits for rank 3 in FSDP's reduce-scatter, so its replica, rank 0, times out too
    assert all(
        words.startswith("RankError: allreduce failed: ") and words.endswith("(1 lines)") for words in said
    )


def accumulating_rank(rank: int, n: int) -> tuple[float, int, int]:
    """Two steps of 3 microbatches, FSDP's all-reduce asked for at the last one only
    (``set_requires_all_reduce``), in both copies: the same gradients, one reduction a step."""
    state = StragglarState(timeout=20)
    native, ours = twins(state)
    reductions = 0
    reduce = state.reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal reductions
        reductions += 1
        return reduce(*args, **kwargs)

    state.reduce = counted  # type: ignore[method-assign]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (native, ours)]
    worst = 0.0
    for step in range(2):
        for optimizer in optimizers:
            optimizer.zero_grad()
        for micro in range(3):
            gen = torch.Generator().manual_seed(100 * rank + 10 * step + micro)
            x, y = torch.randn(8, SIZES[0], generator=gen), torch.randn(8, SIZES[-1], generator=gen)
            for model in (native, ours):
                assert isinstance(model, FSDPModule)
                model.set_requires_all_reduce(micro == 2)
                (model(x) - y).square().mean().backward()
        for a, b in zip(native.parameters(), ours.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None
            torch.testing.assert_close(local(b.grad), local(a.grad), rtol=1e-5, atol=1e-6)
            worst = max(worst, float((local(a.grad) - local(b.grad)).abs().max()))
        for optimizer in optimizers:
            optimizer.step()
    return worst, reductions, state.learned.steps


def test_fsdp_s_accumulation_without_the_all_reduce_reduces_once_a_step() -> None:
    """It reduced at every microbatch: 3 times the replicas' traffic, and 3 steps counted a step."""
    results = launch(accumulating_rank, 4, timeout=60)
    assert max(worst for worst, _, _ in results) < 1e-5
    assert {(reductions, steps) for _, reductions, steps in results} == {(2 * 3, 2)}  # 3 groups a step


def other_settings_rank(rank: int, n: int) -> None:
    """Replica 1 (global ranks 2 and 3) runs the hook in 4 chunks, replica 0 in the paper's."""
    native, ours = twins(StragglarState(timeout=20, chunks=4 if rank >= 2 else None))
    train(rank, native, ours, 1, None)


def test_replicas_with_other_settings_are_named_by_their_global_ranks_too() -> None:
    with pytest.raises(LaunchError) as caught:
        launch(other_settings_rank, 4, timeout=30)
    said = {rank: error.splitlines()[-1] for rank, error in caught.value.errors.items()}
    words = (
        "stragglar.runtime.header.MismatchError: HSDP replicas run the hook with other settings: chunks: "
        "rank 0 has None, rank 1 has 4 (the replicate group's ranks: rank 0 is global rank {}, rank 1 is "
        "global rank {})"
    )
    assert said == {
        0: words.format(0, 2),
        1: words.format(1, 3),
        2: words.format(0, 2),
        3: words.format(1, 3),
    }


def silent_before_first_rank(rank: int, n: int) -> None:
    """Global rank 3 is silent for 12 s before its first backward: the replicas' first-step checks
    wait 5 s for it."""
    torch.set_num_threads(1)
    grid = mesh()
    model = sharded(layers(), grid["shard"])
    use_stragglar(model, StragglarState(timeout=5), replicate_group=grid["replicate"].get_group())
    loss = model(torch.ones(2, SIZES[0])).sum()
    if rank == 3:
        time.sleep(12)
    loss.backward()


def test_a_replica_silent_at_the_first_step_is_named_by_the_check_that_waited() -> None:
    """It said "rank 0 timed out checking that every rank runs the same allreduce", naming no one."""
    with pytest.raises(LaunchError) as caught:
        launch(silent_before_first_rank, 4, timeout=60)
    said = caught.value.errors[1].splitlines()[-1]
    assert said == (
        "stragglar.runtime.failures.RankError: allreduce failed: rank 0 timed out checking that the HSDP "
        "replicas run the hook with the same settings waiting for rank 1: no answer within 5 s (ranks of "
        "the hook's group: rank 0 is global rank 1, rank 1 is global rank 3)"
    ), said
