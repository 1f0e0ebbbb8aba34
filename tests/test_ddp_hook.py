"""The DDP hook on gloo ranks: it returns before a late peer has sent, its gradients are the default
hook's with the asynchronous worker and the auto policy (world sizes 1-5), auto uses StragglAR for
a late rank and the engine otherwise, ``detect`` finds a persistent straggler, and a dead or silent
peer fails the step quickly and clearly.

(No ``from __future__ import annotations``: DDP compares a hook's annotations with the classes.)
"""

import dataclasses
import functools
import gc
import importlib.util
import itertools
import logging
import os
import re
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]
from torch.nn.parallel import DistributedDataParallel as DDP

from stragglar.ddp import Rule, StragglarState, stragglar_hook
from stragglar.errors import ArgumentError, InputError
from stragglar.formats.traces import Columns, read_trace
from stragglar.measure.launch import LaunchError, launch
from stragglar.model import Network, best_chunks
from stragglar.model.policy import PROBE_LAG, Choice
from stragglar.model.whatif import Setting, replay

Pause = Callable[[], None] | None  # called before the hooked model's backward
FAST = Network(1e-3, 1e12)  # latency-bound: StragglAR pays for any real lateness at N <= 5
SLOW = Network(0.0, 500.0)  # 500 B/s: the critical delay of every bucket here is >= 0.3 s
# A rule that names a rank last at every step (by more than 20 ms) within 6 steps at 2 ranks and 4
# at 4 (h = 3.26 and 4.03 at false alarms of 5%, ln(0.95 N) a step), where the default needs 23
# and 10: quick enough for tests of a few steps, and blind to the jitter of shared cores.
QUICK = Rule(false_alarm=0.05, share=0.95, margin=0.02)


@pytest.fixture(scope="module", autouse=True)
def ddp_ready() -> None:
    """DDP's first construction imports torch._dynamo (seconds): import it once, before the fork."""
    import torch._dynamo  # noqa: F401


def small_model() -> torch.nn.Module:
    """Small, but DDP splits its gradients into 3 uneven buckets (1339, 1640, 560 elements) from
    the second step on (the first step has one bucket, before DDP rebuilds them)."""
    sizes = (13, 40, 40, 29, 5)
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers[:-1])


def twins(state: Any, hook: Any = stragglar_hook, **ddp: Any) -> tuple[DDP, DDP]:
    """The same small model twice: with DDP's default hook, and with ``hook`` (and DDP's
    options ``ddp``)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, twin = small_model(), small_model()
    twin.load_state_dict(model.state_dict())
    plain, hooked = DDP(model, bucket_cap_mb=0.001), DDP(twin, bucket_cap_mb=0.001, **ddp)
    hooked.register_comm_hook(state, hook)
    return plain, hooked


def step(
    rank: int, step_index: int, plain: DDP, hooked: DDP, pause: Callable[[], None] | None = None
) -> float:
    """One step of both models on this rank's own data, ``pause`` called before the hooked
    model's backward.  Returns the largest gradient difference (asserted within 1e-6)."""
    gen = torch.Generator().manual_seed(100 * rank + step_index)
    x, y = torch.randn(8, 13, generator=gen), torch.randn(8, 5, generator=gen)
    for m in (plain, hooked):
        m.zero_grad()
        loss = (m(x) - y).square().mean()
        if m is hooked and pause is not None:
            pause()
        loss.backward()
    worst = 0.0
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and a.grad.abs().sum() > 0
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
        worst = max(worst, float((a.grad - b.grad).abs().max()))
    return worst


def late(rank: int, who: int, delay: float) -> Pause:
    """Rank ``who`` sleeps ``delay`` seconds before its backward: its gradients come late."""
    return functools.partial(time.sleep, delay) if rank == who and delay else None


class Watched:
    """A state wrapper that notes, per hook call, whether the Future was done and how long it took."""

    def __init__(self, state: StragglarState) -> None:
        self.state = state
        self.calls: list[tuple[int, bool, float]] = []


def watched_hook(watched: Watched, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    start = time.perf_counter()
    future = stragglar_hook(watched.state, bucket)
    watched.calls.append((watched.state.steps, future.done(), time.perf_counter() - start))
    return future


def late_peer_rank(rank: int, n: int, asynchronous: bool, delay: float) -> list[tuple[int, bool, float]]:
    watched = Watched(StragglarState(asynchronous=asynchronous, timeout=20))
    plain, hooked = twins(watched, watched_hook)
    for i in range(3):
        step(rank, i, plain, hooked, late(rank, n - 1, delay))
    return watched.calls


@pytest.mark.parametrize("asynchronous", [True, False])
def test_the_hook_returns_before_a_late_peer_has_sent(asynchronous: bool) -> None:
    delay = 1.0
    per_rank = launch(late_peer_rank, 3, (asynchronous, delay), timeout=30)
    for rank in (0, 1):  # the punctual ranks, after the first step (groups, headers, plans)
        calls = [(done, took) for s, done, took in per_rank[rank] if s > 1]
        assert len(calls) >= 4
        if asynchronous:
            assert not any(done for done, _ in calls), calls  # the late rank had not sent yet
            # and the call did not wait for it: half the delay leaves room for a loaded machine (a
            # third of a 0.3 s delay once failed there)
            assert max(took for _, took in calls) < delay / 2, calls
        else:  # the synchronous hook waits for the late rank inside the first bucket of each step
            assert all(done for done, _ in calls) and max(took for _, took in calls) >= 0.8 * delay


def staged_rank(rank: int, n: int, delay: float) -> dict[str, list[tuple[int, float]]]:
    """Notes when each bucket's first stage finished here, and when this rank's hook was first
    called in each step (for the late rank: when it arrived), on the hosts' shared clock."""
    from stragglar.ddp.worker import Reducer

    early = Reducer.early
    staged: list[tuple[int, float]] = []  # (step, when a bucket's first stage finished)
    called: list[tuple[int, float]] = []  # (step, when the hook was called for bucket 0)
    state = StragglarState(timeout=20)

    def noted(self: Reducer, job: Any) -> Any:
        handed = early(self, job)
        staged.append((state.steps, time.perf_counter()))
        return handed

    def hook(state: StragglarState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.index() == 0:
            called.append((state.steps + 1, time.perf_counter()))
        return stragglar_hook(state, bucket)

    Reducer.early = noted  # type: ignore[method-assign]  # this rank's process only
    plain, hooked = twins(state, hook)
    for i in range(4):
        step(rank, i, plain, hooked, late(rank, n - 1, delay))
    return {"staged": staged, "called": called}


def test_the_punctual_ranks_reduce_scatter_every_bucket_before_the_late_rank_arrives() -> None:
    """Bucket 2's first rounds do not wait behind bucket 1's last, which wait for the late rank."""
    n, delay = 4, 0.4
    results = launch(staged_rank, n, (delay,), timeout=60)
    arrivals = dict(results[n - 1]["called"])
    for rank in range(n - 1):
        for s in (3, 4):  # after the first steps (groups, headers, DDP's rebuilt buckets)
            finished = [t for step_index, t in results[rank]["staged"] if step_index == s]
            assert len(finished) == 3, results[rank]  # every bucket of the step
            assert max(finished) < arrivals[s], (rank, s, finished, arrivals[s])


def gradient_rank(
    rank: int, n: int, policy: str
) -> tuple[float, list[tuple[int, str, int | None, int | None]], bool]:
    if policy == "auto":  # the last rank 100 ms late each step, named by a quick rule (QUICK): far
        # more than a loaded 2-core machine's jitter between 5 ranks (at 40 ms it once let go of it)
        state = StragglarState(policy="auto", detect=2, network=FAST, timeout=20, rule=QUICK)
        steps, delay = 10, 0.1
    else:  # "stragglar", or "chunked": StragglAR in 9 chunks, uneven over every bucket
        state = StragglarState(timeout=20, chunks=9 if policy == "chunked" else None)
        steps, delay = 3, 0.0
    plain, hooked = twins(state)
    worst = max(step(rank, i, plain, hooked, late(rank, n - 1, delay)) for i in range(steps))
    decisions = list(state.decisions)
    del hooked, state  # the worker thread ends with its state
    gc.collect()
    deadline = time.monotonic() + 5
    while (
        any(t.name.startswith("stragglar-ddp") for t in threading.enumerate()) and time.monotonic() < deadline
    ):
        time.sleep(0.01)
    return worst, decisions, any(t.name.startswith("stragglar-ddp") for t in threading.enumerate())


@pytest.mark.parametrize("policy", ["stragglar", "chunked", "auto"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_async_and_auto_give_the_default_gradients(n: int, policy: str) -> None:
    results = launch(gradient_rank, n, (policy,), timeout=60)
    assert max(worst for worst, _, _ in results) < 1e-6
    assert not any(alive for _, _, alive in results)  # no worker thread outlived its state
    decisions = {tuple(d) for _, d, _ in results}
    assert len(decisions) == 1, decisions  # every rank chose the same for every bucket
    (chosen,) = decisions
    if n == 1:
        assert chosen == ()  # one rank has nothing to reduce
    elif policy != "auto":
        assert chosen == ((1, "stragglar", n - 1, 9 if policy == "chunked" else None),)
    else:  # the engine until a window of figures is in, then StragglAR for the late rank
        assert chosen[0] == (1, "allreduce", None, None), chosen
        assert chosen[-1][1:] == ("stragglar", n - 1, None), chosen  # tiny buckets: the paper's N-1


class Scaled(torch.nn.Module):
    """Six float16 weights, each gradient the rank's own input: 32768 - 64 k, distinct for every
    rank and element and exactly representable, as are their quarters and every partial sum of
    four quarters; four of them summed are ~131,000, past float16's largest (65,504)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(6, dtype=torch.float16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.weight * x).sum()


def half_rank(rank: int, n: int, policy: str) -> list[list[float]]:
    torch.manual_seed(0)
    plain, hooked = DDP(Scaled()), DDP(Scaled())
    hooked.register_comm_hook(StragglarState(policy=policy, timeout=20), stragglar_hook)
    x = torch.tensor([32768 - 64 * (rank * 6 + e) for e in range(6)], dtype=torch.float16)
    grads = []
    for _ in range(2):
        for m in (plain, hooked):
            m.zero_grad()
            m(x).backward()
        assert plain.module.weight.grad is not None and hooked.module.weight.grad is not None
        assert torch.equal(hooked.module.weight.grad, plain.module.weight.grad)
        grads.append(hooked.module.weight.grad.tolist())
    return grads


@pytest.mark.parametrize("policy", ["stragglar", "auto"])
def test_float16_gradients_are_divided_before_they_are_summed_as_ddp_does(policy: str) -> None:
    """Summed first, then divided, the hook's gradients were inf where DDP's are ~32,700."""
    results = launch(half_rank, 4, (policy,), timeout=60)
    mean = [sum(32768 - 64 * (r * 6 + e) for r in range(4)) / 4 for e in range(6)]
    assert all(grads == [mean, mean] for grads in results), results


def punctual_rank(rank: int, n: int, network: Network | None) -> dict[str, Any]:
    state = StragglarState(policy="auto", detect=2, network=network, timeout=20, rule=QUICK)
    plain, hooked = twins(state)
    worst = max(step(rank, i, plain, hooked) for i in range(6))
    assert state.probe is not None and state.outlook is None  # nobody named, nobody bet on
    return {
        "worst": worst,
        "decisions": state.decisions,
        "ring": state.learned.policy.ring,
        "samples": len(state.probe.samples["allreduce"]),
    }


@pytest.mark.parametrize("network", [SLOW, None], ids=["given", "fitted"])
def test_auto_uses_the_engine_when_nobody_is_late_enough(network: Network | None) -> None:
    results = launch(punctual_rank, 4, (network,), timeout=60)
    assert max(r["worst"] for r in results) < 1e-6
    assert len({tuple(r["decisions"]) for r in results}) == 1
    if network is not None:  # every critical delay is far above any lateness here
        assert all(r["decisions"] == [(1, "allreduce", None, None)] for r in results)
    else:  # fitted to the engine's own timings, the same network on every rank
        ring = results[0]["ring"]
        assert ring is not None and ring.bandwidth > 0 and all(r["ring"] == ring for r in results)
        assert all(r["samples"] > 0 and r["decisions"][0] == (1, "allreduce", None, None) for r in results)


def closing_engine_rank(rank: int, n: int) -> tuple[int, bool, bool, bool]:
    """Three steps on the engine's all_reduce (auto, nobody late to it but rank 1, 0.2 s late at
    the last), then ``close``.  At the last step rank 0 adds a callback to each all_reduce that
    keeps gloo's thread 0.3 s on it after DDP has the bucket (a thread descheduled there).
    Returns the last step's works, whether each is complete, whether gloo's thread let go of
    each callback by the end of ``close``, and whether the works are still held (they end with
    the state, in this thread)."""
    from stragglar.ddp import engine_allreduce

    state = StragglarState(policy="auto", network=SLOW, timeout=20)
    plain, hooked = twins(state)
    engine = engine_allreduce.all_reduce

    def slowed(
        buffer: torch.Tensor,
        divisor: int,
        order: Any,
        host_group: Any,
        in_call: bool,
        group: Any,
        seconds: float,
        resources: Any,
    ) -> torch.futures.Future[torch.Tensor]:
        future = engine(buffer, divisor, order, host_group, in_call, group, seconds, resources)
        if rank == 0 and state.learned.steps == 3:  # in flight: rank 1 is late
            work, _ = state.resources.engine_calls[-1]
            work.get_future().add_done_callback(lambda _: time.sleep(0.3))
        return future

    engine_allreduce.all_reduce = slowed  # this forked rank's alone
    for i in range(3):
        step(rank, i, plain, hooked, late(rank, 1, 0.2 if i == 2 else 0.0))
    calls = list(state.resources.engine_calls)
    state.close()
    return (
        len(calls),
        all(work.is_completed() for work, _ in calls),
        all(callback() is None for _, callback in calls),
        state.resources.engine_calls == calls,
    )


def test_close_waits_until_gloo_s_thread_let_go_of_the_engine_s_last_all_reduces() -> None:
    """At exit (a script that never destroys its groups) a gloo thread still waiting for the GIL to
    let go of an all_reduce's callback, or of its work, aborted the process now and then: close
    returned with the callbacks still held."""
    for count, completed, released, kept in launch(closing_engine_rank, 2, timeout=60):
        assert count == 3 and completed and released and kept  # small_model's three buckets


def dying_rank(rank: int, n: int, kwargs: dict[str, Any], silent: bool) -> None:
    state = StragglarState(timeout=1.5, **kwargs)
    plain, hooked = twins(state)

    def die() -> None:  # after the default hook's step, before the hooked backward
        if silent:
            time.sleep(60)  # alive, but never sends again
        os._exit(3)

    for i in range(4):
        step(rank, i, plain, hooked, die if i == 2 and rank == 2 else None)


@pytest.mark.parametrize(
    ("kwargs", "silent"),
    [
        ({}, False),
        pytest.param({}, True, marks=pytest.mark.slow),  # 1.5 s timeout + the launcher's 5 s grace
        ({"policy": "auto", "detect": 1, "network": SLOW}, False),
        # gloo's all_reduce waited for the process group's 30 minutes, not the state's timeout
        pytest.param({"policy": "auto", "detect": 1, "network": SLOW}, True, marks=pytest.mark.slow),
    ],
    ids=["stragglar-dead", "stragglar-silent", "engine-dead", "engine-silent"],
)
def test_a_dead_or_silent_peer_fails_the_step_quickly(kwargs: dict[str, Any], silent: bool) -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(dying_rank, 4, (kwargs, silent), timeout=20)
    assert time.monotonic() - start < 15  # not one timeout per bucket, and no hang
    errors = info.value.errors
    line = str(info.value).splitlines()[0]
    assert set(errors) == {0, 1, 2, 3} and line.startswith("4 of 4 ranks failed: rank 2 "), line
    if kwargs and not silent:  # see below: some ranks may time out
        assert "lost the connection" in line, line
    else:
        assert f"ranks 0, 1, 3 {'timed out' if silent else 'lost the connection'}" in line, line
    if not kwargs:  # StragglAR's rounds say where
        assert all(f"allreduce failed: rank {rank} " in errors[rank] for rank in (0, 1, 3)), errors
    elif silent:  # the state's timeout ends the engine's all_reduce, and says so, and whom it waited for
        said = "timed out in the engine's all_reduce waiting for rank 2: no answer within 1.5 s (the state's "
        said += "timeout); rank 2 had not reached it"
        assert all(f"allreduce failed: rank {rank} {said}" in errors[rank] for rank in (0, 1, 3)), errors
    else:  # gloo's own error, a RankError's detail, and the rank the roll call did not find (gloo
        # names an address): rank 2 died before the call.  A rank whose pairs with rank 2 broke
        # says so; the others wait while those hold their roll call (up to 3 s), and may pass
        # their 1.5 s deadline first: a timeout, whose roll call names rank 2 too
        for rank in (0, 1, 3):
            said = (
                rf"allreduce failed: rank {rank} (lost the connection|timed out) in the engine's all_reduce "
            )
            assert re.search(said + "waiting for rank 2: ", errors[rank]), errors[rank]
            assert "; rank 2 had not reached it" in errors[rank], errors[rank]


def test_the_ranks_a_timed_out_engine_call_waited_for_are_named() -> None:
    """Under auto a silent rank 2 (alive, never at the engine's all_reduce) left every other rank
    saying it timed out, not who it waited for: an all_reduce cannot tell.  The store's roll call
    does (stragglar/runtime/roll_call.py; the launcher's ranks share a FileStore)."""
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(dying_rank, 3, ({"policy": "auto", "detect": 1, "network": SLOW}, True), timeout=20)
    assert time.monotonic() - start < 15
    errors, line = info.value.errors, str(info.value).splitlines()[0]
    assert line.startswith("3 of 3 ranks failed: rank 2 ") and "ranks 0, 1 timed out" in line, line
    said = "timed out in the engine's all_reduce waiting for rank 2: no answer within 1.5 s (the state's "
    said += "timeout); rank 2 had not reached it"
    assert all(f"allreduce failed: rank {rank} {said}" in errors[rank] for rank in (0, 1)), errors


def test_the_engine_s_failures_say_which_timeout_ended_them() -> None:
    """On the host the state's deadline bounds the engine's all_reduce (its group's own timeout
    just after): a timeout is said as the state's.  On CUDA the process group's ends it, in the
    engine's words: not the state's timeout, which bounds nothing there."""
    from stragglar.ddp.engine_allreduce import engine_error

    nccl = RuntimeError("Watchdog caught collective operation timeout: ran for 1800012 milliseconds")
    assert (
        str(engine_error(1, nccl, None))
        == f"allreduce failed: rank 1 timed out in the engine's all_reduce: {nccl}"
    )
    gloo = RuntimeError("[../gloo/transport/tcp/pair.cc:446] Timed out waiting 302000ms for recv operation")
    said = "allreduce failed: rank 1 timed out in the engine's all_reduce: no answer within 300 s (the "
    said += "state's timeout)"
    assert str(engine_error(1, gloo, 300.0)) == str(engine_error(1, None, 300.0)) == said
    lost = RuntimeError("Connection closed by peer [127.0.0.1]:4242")
    error = engine_error(1, lost, 300.0)
    assert str(error) == f"allreduce failed: rank 1 lost the connection in the engine's all_reduce: {lost}"
    assert (error.rank, error.reason, error.during) == (
        1,
        "lost the connection",
        "in the engine's all_reduce",
    )
    named = engine_error(1, lost, 300.0, [3, 2])  # the ranks the roll call did not find
    said = (
        f"allreduce failed: rank 1 lost the connection in the engine's all_reduce waiting for rank 2: {lost}"
    )
    assert str(named) == f"{said}; ranks 2, 3 had not reached it or had left it" and named.peer == 2


def first_failing_step(rank: int, n: int, settings: dict[str, Any]) -> tuple[int, str]:
    plain, hooked = twins(StragglarState(timeout=20, **settings))
    for i in range(6):
        try:
            step(rank, i, plain, hooked)
        except Exception as e:  # DDP wraps the hook's error
            return i, str(e)
    return -1, "no error"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"chunks": 2}, "needs at least N - 1 = 3 chunks, got 2"),
        ({"straggler": 7}, "StragglarState.straggler"),
        ({"algorithm": "rhd", "straggler": None}, "power-of-two"),
    ],
    ids=["chunks", "straggler", "rhd"],
)
def test_auto_refuses_options_the_world_size_rules_out_at_the_first_step(
    settings: dict[str, Any], words: str
) -> None:
    """They were refused when auto first bet on StragglAR, steps into training."""
    n = 3 if settings.get("algorithm") == "rhd" else 4
    results = launch(first_failing_step, n, ({"policy": "auto", **settings},), timeout=60)
    assert all(failed == 0 and words in said for failed, said in results), results


def on_group_rank(rank: int, n: int, world_object: bool) -> tuple[int, str]:
    group = dist.group.WORLD if world_object else dist.new_group(list(range(n)))
    plain, hooked = twins(StragglarState(timeout=20, policy="auto", process_group=group), process_group=group)
    for i in range(3):
        try:
            step(rank, i, plain, hooked)
        except Exception as e:
            return i, str(e)
    return -1, "no error"


def test_auto_runs_on_the_world_group_given_by_name_and_refuses_another() -> None:
    """dist.group.WORLD was refused as not "the default (world) process group"."""
    assert launch(on_group_rank, 3, (True,), timeout=60) == [(-1, "no error")] * 3
    refused = launch(on_group_rank, 3, (False,), timeout=60)
    assert all(i == 0 and "need the default (world) process group" in said for i, said in refused), refused


def mixed_dtype_rank(rank: int, n: int, policy: str) -> str:
    """Rank 1's model in float64, the others' in float32, of the same shapes."""
    torch.manual_seed(0)
    model = small_model().double() if rank == 1 else small_model()
    hooked = DDP(model)
    hooked.register_comm_hook(StragglarState(policy=policy, timeout=20), stragglar_hook)
    x = torch.ones(2, 13, dtype=torch.float64 if rank == 1 else torch.float32)
    try:
        hooked(x).sum().backward()
    except Exception as e:  # DDP wraps the hook's error
        return str(e).splitlines()[-1] if "MismatchError" not in str(e) else str(e)
    return "no error"


@pytest.mark.parametrize("policy", ["auto", "stragglar"])
def test_ranks_that_reduce_gradients_of_other_dtypes_fail_alike(policy: str) -> None:
    """Under auto the engine's all_reduce met them first, and gloo aborted every process."""
    results = launch(mixed_dtype_rank, 3, (policy,), timeout=60)
    if policy == "auto":
        said = (
            "DDP ranks reduce other gradients (another model or dtype?): ranks 0, 2 hand bucket 0 of "
            "3,539 float32 elements; rank 1 hands bucket 0 of 3,539 float64 elements"
        )
    else:  # the runtime's header check
        said = "dtype: ranks 0, 2 have float32, rank 1 has float64"
    assert all(said in result for result in results), results


def disagreeing_rank(
    rank: int, n: int, settings: dict[str, Any], common: dict[str, Any] | None = None
) -> str:
    """Rank 1 runs the hook with ``settings``, the others with the defaults (all with ``common``):
    the first step fails on every rank with the same error, and at once, not after the header
    check's timeout."""
    state = StragglarState(**{"timeout": 20, **(common or {}), **(settings if rank == 1 else {})})
    plain, hooked = twins(state)
    try:
        step(rank, 0, plain, hooked)
    except Exception as e:  # DDP wraps the hook's error
        return str(e)
    return "no error"


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"policy": "auto"}, "policy: ranks 0, 2 have 'stragglar', rank 1 has 'auto'"),
        ({"algorithm": "ring"}, "algorithm: ranks 0, 2 have 'stragglar', rank 1 has 'ring'"),
        ({"asynchronous": False}, "asynchronous: ranks 0, 2 have True, rank 1 has False"),
        ({"detect": 4}, "detect: ranks 0, 2 have 0, rank 1 has 4"),
        ({"engine": "device"}, "engine: ranks 0, 2 have 'rounds', rank 1 has 'device'"),
        ({"straggler_delay": 0.25}, "straggler_delay: ranks 0, 2 have 0.0, rank 1 has 0.25"),
        ({"graphs": False}, "graphs: ranks 0, 2 have True, rank 1 has False"),
        (
            {"straggler": 0, "chunks": 4},
            "chunks: ranks 0, 2 have None, rank 1 has 4; straggler: ranks 0, 2 have",
        ),
    ],
)
def test_ranks_whose_hooks_run_with_other_settings_fail_alike_and_at_once(
    settings: dict[str, Any], words: str
) -> None:
    start = time.monotonic()
    errors = launch(disagreeing_rank, 3, (settings,), timeout=30)
    assert time.monotonic() - start < 15  # far from the 20 s a silent peer would take
    reasons = {e[e.index("DDP ranks run the hook") :].splitlines()[0] for e in errors}
    assert len(reasons) == 1, errors
    assert words in reasons.pop()


def hookless_rank(rank: int, n: int) -> None:
    """Rank 1 builds the same DDP models but never registers the hook, nor trains: silent."""
    if rank == 1:  # DDP's default hook on the plain copy, as the others run it; then silent
        torch.set_num_threads(1)
        plain, _ = DDP(small_model(), bucket_cap_mb=0.001), DDP(small_model(), bucket_cap_mb=0.001)
        (plain(torch.randn(8, 13)) - torch.randn(8, 5)).square().mean().backward()
        time.sleep(4)
        raise RuntimeError("rank 1 never ran the hook")
    raise RuntimeError(disagreeing_rank(rank, n, {}, {"timeout": 1.5}))


def test_a_rank_that_never_runs_the_hook_is_named_by_those_that_wait_for_it() -> None:
    """They said they timed out "checking that every rank runs the same allreduce", naming nobody."""
    with pytest.raises(LaunchError) as info:
        launch(hookless_rank, 3, (), timeout=30)
    check = "checking that the DDP ranks run the hook with the same settings waiting for rank 1"
    for rank in (0, 2):  # the first to time out closes its pairs, which may end the other's wait
        said = info.value.errors[rank]
        assert re.search(f"rank {rank} (timed out|lost the connection) {check}: ", said), said


def test_a_resumed_state_still_checks_the_settings_at_its_first_step() -> None:
    """A state built with steps=5 (a run resumed) skipped the check: every rank timed out, or
    one met torch's own store error, without a word about the setting."""
    errors = launch(disagreeing_rank, 3, ({"algorithm": "ring"}, {"steps": 5}), timeout=30)
    reasons = {e[e.index("DDP ranks run the hook") :].splitlines()[0] for e in errors}
    assert len(reasons) == 1 and "algorithm: ranks 0, 2 have 'stragglar', rank 1 has 'ring'" in reasons.pop()


def detecting_rank(rank: int, n: int, steps: int, who: int) -> tuple[list[tuple[int, int]], float]:
    state = StragglarState(detect=4, timeout=20)  # the default rule
    plain, hooked = twins(state)
    # 100 ms late: a punctual rank delayed as long by a loaded machine would reset the evidence
    worst = max(step(rank, i, plain, hooked, late(rank, who, 0.1)) for i in range(steps))
    assert state.straggler == who
    return state.switches, worst


def test_detect_finds_the_persistent_straggler_and_keeps_the_gradients() -> None:
    results = launch(detecting_rank, 4, (14, 1), timeout=90)
    switches = {tuple(s) for s, _ in results}
    assert len(switches) == 1, switches  # every rank switched at the same step
    (only,) = switches
    # ln(4 / 1e-4) / ln 3 = 9.7: the 10th step's figures name it, at step 12 (two steps later)
    assert [rank for _, rank in only] == [1] and 12 <= only[0][0] <= 13, only
    assert max(w for _, w in results) < 1e-6


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"policy": "fast"}, InputError, "policy must be one of stragglar, auto"),
        ({"network": (1e-6, 1e9)}, ArgumentError, "network must be a stragglar.model.Network"),
        ({"asynchronous": 1}, ArgumentError, "asynchronous must be True or False"),
        ({"policy": "auto", "straggler_delay": 0.01}, InputError, "straggler_delay is for experiments"),
        ({"chunks": "many"}, InputError, "chunks must be a chunk count or 'auto'"),
        ({"chunks": 0}, InputError, "chunks must be at least 1"),
        ({"chunks": 2.5}, ArgumentError, "chunks must be an integer"),
        ({"chunks": 8, "algorithm": "ring"}, InputError, "chunks shapes StragglAR, not ring"),
        ({"chunks": "auto"}, InputError, "chunks='auto' prices chunk counts on a network"),
        (
            {"network": Network(3e-6, 2**30)},
            InputError,
            "algorithm='stragglar' and chunks=None it prices nothing: give chunks='auto' or leave",
        ),
        ({"network": Network(3e-6, 2**30), "chunks": 12}, InputError, "and chunks=12 it prices nothing"),
        (
            {"network": Network(3e-6, 2**30), "algorithm": "ring"},
            InputError,
            r"algorithm='ring' and chunks=None it prices nothing: leave it out$",
        ),
        ({"engine": "kernels"}, InputError, "engine must be one of rounds, device, got 'kernels'"),
        ({"engine": "device", "graphs": False}, InputError, "graphs applies to the rounds engine, not"),
        (
            {"asynchronous": False, "graphs": False},
            InputError,
            "graphs applies to the worker threads' rounds, not to asynchronous=False, whose rounds run",
        ),
        (
            {"proofs": [1]},
            ArgumentError,
            r"^StragglarState.proofs must be a dict of proofs or None, got \[1\]$",
        ),
        ({"decisions": 5}, ArgumentError, "decisions must be a list of decisions or None, got 5"),
        ({"switches": "x"}, ArgumentError, "switches must be a list of .* or None, got 'x'"),
        ({"probe": "x"}, ArgumentError, "probe must be a stragglar.ddp.probe.LateRankProbe or None"),
        ({"steps": -5}, InputError, "steps must be at least 0, got -5"),
        ({"steps": True}, ArgumentError, "steps must be an integer, got True"),
    ],
)
def test_the_state_checks_its_new_arguments(kwargs: dict[str, Any], error: type, words: str) -> None:
    with pytest.raises(error, match=words) as info:
        StragglarState(**kwargs)
    assert "\n" not in str(info.value)


def ddp_rank(rank: int, n: int, kwargs: dict[str, Any], steps: int, pause: float = 0.0) -> float:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(7, 11), torch.nn.Tanh(), torch.nn.Linear(11, 3))
    twin = torch.nn.Sequential(torch.nn.Linear(7, 11), torch.nn.Tanh(), torch.nn.Linear(11, 3))
    twin.load_state_dict(model.state_dict())
    plain, hooked = DDP(model), DDP(twin, bucket_cap_mb=0.0002)
    hooked.register_comm_hook(StragglarState(timeout=20, **kwargs), stragglar_hook)
    gen = torch.Generator().manual_seed(rank)
    worst = 0.0
    for _ in range(steps):
        time.sleep(pause)
        x, y = torch.randn(4, 7, generator=gen), torch.randn(4, 3, generator=gen)
        for m in (plain, hooked):
            m.zero_grad()
            torch.nn.functional.mse_loss(m(x), y).backward()  # type: ignore[no-untyped-call]
        for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
            assert a.grad is not None and b.grad is not None and a.grad.abs().sum() > 0
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)
            worst = max(worst, float((a.grad - b.grad).abs().max()))
    return worst


@pytest.mark.parametrize(
    ("n", "kwargs"),
    [
        (1, {}),
        (1, {"straggler": np.int64(0), "straggler_delay": 0.01}),
        (2, {}),
        (2, {"algorithm": "ring", "straggler": np.int64(0), "straggler_delay": 0.01}),
    ],
)
@pytest.mark.usefixtures("ddp_ready")
def test_the_ddp_hook_works_on_one_and_two_ranks(n: int, kwargs: dict[str, Any]) -> None:
    worst = launch(ddp_rank, n, (kwargs, 2), timeout=60)
    assert len(worst) == n and max(worst) < 1e-6


@pytest.mark.usefixtures("ddp_ready")
def test_a_long_ddp_run_under_the_launcher_reports_progress_every_step() -> None:
    start = time.monotonic()
    worst = launch(ddp_rank, 2, ({}, 6, 0.3), timeout=1.0, slack=0.3)  # 1.8 s of steps > 1.3 s
    assert time.monotonic() - start > 1.3 and max(worst) < 1e-6


def test_the_stragglar_policy_cuts_each_bucket_by_the_given_network() -> None:
    nvlink = Network(3e-6, 450 * 2**30)
    state = StragglarState(chunks="auto", network=nvlink)
    for size in (2**20, 2**30):
        best = best_chunks(8, size, 0.0, nvlink)
        want = Choice("stragglar", 7, None if best == 7 else best)
        assert state.choose(8, size) == want
    assert [d[3] for d in state.decisions] == [
        None if c == 7 else c for c in (best_chunks(8, 2**20, 0.0, nvlink), best)
    ]
    assert StragglarState(chunks=12, straggler=2).choose(8, 2**20) == Choice("stragglar", 2, 12)
    assert StragglarState(chunks=12, straggler=2).proof(8, 2, 12).schedule.num_chunks == 12


@pytest.mark.parametrize("algorithm", ["ring", "rhd", "direct"])
def test_the_decisions_name_the_algorithm_that_ran(algorithm: str) -> None:
    """They said 'stragglar' (the policy's word for "the state's schedule") for any algorithm."""
    state = StragglarState(algorithm=algorithm, straggler=2)
    assert state.choose(8, 2**20) == Choice("stragglar", 2, None)
    assert state.decisions == [(0, algorithm, 2, None)]


def test_the_state_keeps_its_options_what_it_learns_and_what_it_holds_apart() -> None:
    """Options are fields of the state, each keyword as before; what it learns and what it holds
    are objects of their own, read through the attributes users read before."""
    proofs: dict[Any, Any] = {}
    switches = [(1, 2)]
    decisions: list[tuple[int, str, int | None, int | None]] = [(1, "allreduce", None, None)]
    state = StragglarState(
        straggler=2, chunks=12, proofs=proofs, switches=switches, decisions=decisions, steps=3
    )
    assert len(dataclasses.fields(state)) <= 17  # 15 options, then learned and resources
    assert [f.name for f in dataclasses.fields(state)][-2:] == ["learned", "resources"]
    assert state.proofs is proofs is state.resources.proofs and state.probe is None
    assert state.switches is switches and state.decisions is decisions and state.steps == 3
    assert state.outlook is None and state.learned.last is None
    state.choose(8, 2**20)
    state.proof(8, 2, 12)
    assert state.decisions == [(1, "allreduce", None, None), (3, "stragglar", 2, 12)]
    assert list(proofs) == [(8, 2, 12)] and state.learned.last == Choice("stragglar", 2, 12)
    fresh = StragglarState()
    assert (fresh.steps, fresh.switches, fresh.decisions, fresh.proofs) == (0, [], [], {})


def recording_rank(rank: int, n: int, path: str, steps: int) -> tuple[list[Any], list[int]]:
    """Rank 1 late by 30 ms in the first half of the steps, punctual after; the auto policy on
    FAST, recording the trace.  Returns the decisions and the bucket sizes of the last step."""
    state = StragglarState(policy="auto", network=FAST, record=path, timeout=20, rule=QUICK)
    plain, hooked = twins(state)
    for i in range(steps):
        step(rank, i, plain, hooked, late(rank, 1, 0.03 if i < steps // 2 else 0.0))
    sizes = [p.numel() * p.element_size() for p in hooked.parameters()]
    return state.decisions, sizes


def test_a_trace_the_hook_records_replays_to_the_decisions_it_made(tmp_path: Any) -> None:
    steps, path = 14, tmp_path / "trace.jsonl"
    results = launch(recording_rank, 3, (str(path), steps), timeout=60)
    (group,) = read_trace(path, "jsonl", Columns(), ())
    recorded = steps - PROBE_LAG  # the last two steps' figures were never gathered
    # nor step 1's: the ranks had just met (the probe's group, the settings' check), so every
    # wait was ~0 and the row named a random rank last
    assert group.ranks == ("0", "1", "2") and group.steps == tuple(range(2, recorded + 1))
    assert all(line.endswith("}") for line in path.read_text().splitlines())
    decisions, sizes = results[0]
    assert all(d == decisions for d, _ in results)
    # FAST prices every bucket of this model alike, so one bucket's choices are every bucket's
    replayed = replay(group.times, group.steps, Setting(FAST, (sum(sizes),), rule=QUICK))
    made = [tuple(d) for d in decisions if d[0] <= recorded]
    # the engine before any figures: the replay's from the trace's first step, the hook's from step 1
    assert made[0] == (1, "allreduce", None, None) and replayed.decisions[0] == (2, *made[0][1:])
    assert list(replayed.decisions[1:]) == made[1:]
    assert any(d[1] == "stragglar" and d[2] == 1 for d in made), made  # rank 1 was caught late
    assert replayed.episodes[0].rank == 1


def recording_only_rank(rank: int, n: int, path: str) -> tuple[Any, list[Any], list[Any]]:
    """The "stragglar" policy, no detect: recording runs the probe, and changes no choice."""
    state = StragglarState(record=path, timeout=20)
    plain, hooked = twins(state)
    for i in range(6):
        step(rank, i, plain, hooked, late(rank, 0, 0.1))
    return state.straggler, state.switches, state.decisions


def test_recording_under_the_stragglar_policy_keeps_its_straggler(tmp_path: Any) -> None:
    path = tmp_path / "trace.jsonl"
    results = launch(recording_only_rank, 2, (str(path),), timeout=60)
    assert all(r == (None, [], [(1, "stragglar", 1, None)]) for r in results), results
    (group,) = read_trace(path, "jsonl", Columns(), ())
    # rank 0 is late at every recorded step (step 1's row, recorded before, named either)
    assert group.steps == (2, 3, 4) and all(row[0] > row[1] for row in group.times), group.times


def test_a_record_path_that_cannot_be_written_is_refused_when_the_state_is_built(tmp_path: Any) -> None:
    """On every rank, before training: rank 0 used to find out at step 3, alone (and a FIFO hung it)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, said in (
        (fifo, "is not a regular file"),
        (tmp_path, "is not a regular file"),
        ("/dev/full", "is not a regular file"),
        (tmp_path / "missing" / "t.jsonl", "its folder does not exist"),
    ):
        with pytest.raises(InputError, match=said):
            StragglarState(record=path)


def test_a_record_file_that_holds_a_trace_is_refused_for_a_run_from_step_one(tmp_path: Any) -> None:
    """The second run appended its steps 1, 2, ... after the first's, and whatif then refused the
    file ("rank 0 at step 1 is there twice"), after training."""
    path = tmp_path / "trace.jsonl"
    path.write_text("")
    assert StragglarState(record=path).record == path  # empty: nothing to repeat
    path.write_text('{"step": 1, "rank": 0, "time": 0.0}\n')
    with pytest.raises(InputError, match="holds a trace already, whose steps a run from step 1 would repeat"):
        StragglarState(record=path)
    assert StragglarState(record=path, steps=5).steps == 5  # a run resumed appends after them


def test_auto_refuses_ring_which_it_would_never_choose() -> None:
    """It prices the engine's all_reduce as a Ring: Ring never beats it, so it never ran."""
    with pytest.raises(InputError, match=r"algorithm='ring' would never run: use policy='stragglar'$"):
        StragglarState(policy="auto", algorithm="ring")
    assert StragglarState(policy="stragglar", algorithm="ring").algorithm == "ring"


@pytest.mark.parametrize("wrong", [None, "a group"])
def test_the_hook_given_another_state_says_what_it_needs(wrong: object) -> None:
    """A ProcessGroup there, as torch's own hooks take, failed inside backward with AttributeError."""
    with pytest.raises(
        ArgumentError, match=f"state must be a stragglar.ddp.StragglarState .*got {type(wrong).__name__}$"
    ):
        stragglar_hook(wrong, None)  # type: ignore[arg-type]


def test_the_hook_given_a_gradient_and_its_parameter_says_it_reduces_buckets() -> None:
    """DDP's python reducer under compiled autograd calls comm hooks with (grad, param): the hook
    failed in backward with "'tuple' object has no attribute 'buffer'"."""
    grad = torch.zeros(4)
    with pytest.raises(ArgumentError, match=r"reduces DDP's gradient buckets, got a tuple: .*python_reducer"):
        stragglar_hook(StragglarState(), (grad, torch.nn.Parameter(grad)))  # type: ignore[arg-type]


def test_record_needs_a_file_name() -> None:
    with pytest.raises(ArgumentError, match="record must name a file"):
        StragglarState(record=3)  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="record must name a file"):
        StragglarState(record="")


def test_record_and_metrics_in_one_file_are_refused(tmp_path: Path) -> None:
    """The metrics, replaced at every step, wiped the trace, and the run ended 0 with a file that
    ``stragglar whatif`` then refused: the same file by another name (a link) is refused too."""
    trace = tmp_path / "run.jsonl"
    (tmp_path / "also.jsonl").symlink_to(trace)
    for metrics in (trace, str(trace), tmp_path / "also.jsonl", tmp_path / "." / "run.jsonl"):
        with pytest.raises(
            InputError, match=r"record and metrics name one file .*give each a file of its own$"
        ):
            StragglarState(record=trace, metrics=metrics)
    assert StragglarState(record=trace, metrics=tmp_path / "run.prom").metrics == tmp_path / "run.prom"


def reporting_rank(rank: int, n: int, who: int | None, path: str) -> dict[str, Any]:
    """Ten steps with rank ``who`` sleeping 200 ms before its backward (None: nobody late); the
    probe runs for the metrics file.  Returns what the ``stragglar`` logger said, at which step,
    and what the state reports."""
    said: list[tuple[int, int, str]] = []
    state = StragglarState(rule=QUICK, metrics=path, timeout=20)

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said.append((state.steps, record.levelno, record.getMessage()))

    logger = logging.getLogger("stragglar")
    logger.addHandler(keep := Keep())
    logger.setLevel(logging.INFO)
    try:
        plain, hooked = twins(state)
        for i in range(10):
            step(rank, i, plain, hooked, late(rank, who, 0.2) if who is not None else None)
    finally:
        logger.removeHandler(keep)
    return {
        "said": said,
        "named": state.persistent_straggler,
        "figures": state.late_ranks(),
        "metrics": open(path).read() if rank == 0 else "",
    }


@pytest.mark.parametrize("who", [1, None], ids=["rank 1 late", "nobody late"])
def test_the_hook_names_the_late_rank_in_its_log_its_figures_and_its_metrics(
    tmp_path: Any, who: int | None
) -> None:
    path = tmp_path / "stragglar.prom"
    results = launch(reporting_rank, 2, (who, str(path)), timeout=90)
    first, second = results
    assert second["said"] == []  # rank 0 alone logs
    assert first["named"] == second["named"] == who
    assert first["figures"] == second["figures"] and len(first["figures"]) == 2  # every rank alike
    assert [p.name for p in tmp_path.iterdir()] == ["stragglar.prom"]  # replaced whole, no temporary left
    assert "# TYPE stragglar_last_share gauge" in first["metrics"]
    if who is None:
        assert first["said"] == []  # with nobody late, no line
        assert "stragglar_persistent_straggler -1" in first["metrics"]
        return
    ((at, level, line),) = first["said"]
    assert at <= 10 and level == logging.WARNING
    assert line.startswith("persistent straggler: rank 1 since step "), line
    figures = first["figures"][1]
    # last at every step but perhaps the first (DDP's first step builds its buckets on every rank)
    assert figures.persistent and figures.last_share >= 7 / 8 and 0.15 < figures.median < 0.5
    assert first["figures"][0].median < -0.15 and not first["figures"][0].persistent
    assert "stragglar_persistent_straggler 1" in first["metrics"]
    assert 'stragglar_persistent{rank="1"} 1' in first["metrics"]


Event = tuple[str, int, int, bool]  # what, step, bucket size, whether a registration holds the bucket


def device_path_rank(
    rank: int, n: int, asynchronous: bool, view: bool, steps: int
) -> tuple[list[Event], int, list[tuple[int, float]]]:
    """The hook with ``engine="device"`` in real DDP on gloo, the device engine stood in by the
    rounds engine (its kernels need a GPU; they are tested on their own), rank n - 1 late by
    0.2 s at every step: a launched call runs the rounds in a thread of its own (each bucket's on
    its own tag), which its wait joins.  The gradients are the default hook's.  Returns each call
    (whole, or launched for the second thread to wait for) and registration, how many works were
    waited for (each on the hook's second group), and when each launch was made, by step."""
    from unittest import mock

    from test_ddp_worker import Held

    from stragglar.ddp import hook, worker
    from stragglar.runtime import allreduce as rounds

    state = StragglarState(engine="device", asynchronous=asynchronous, timeout=20)
    held: list[Held] = []
    events: list[Event] = []
    launches: list[tuple[int, float]] = []
    waited: list[Any] = []

    def holds(data: torch.Tensor) -> bool:
        return any(r.holds(data) for r in held)

    def register_buffer(data: torch.Tensor, group: Any, *, timeout: float) -> Held:
        events.append(("register", state.steps, data.numel(), holds(data)))
        held.append(Held(data))
        return held[-1]

    class Launched:
        """The rounds in a thread, as a kernel runs on its own; the wait joins it."""

        def __init__(self, data: torch.Tensor, proof: Any, options: dict[str, Any]) -> None:
            self.error: Exception | None = None
            self.thread = threading.Thread(target=self.run, args=(data, proof, options))
            self.thread.start()

        def run(self, data: torch.Tensor, proof: Any, options: dict[str, Any]) -> None:
            try:
                rounds(data, proof, **options)
            except Exception as e:  # raised by the wait
                self.error = e

        def wait(self, group: Any = None) -> None:
            waited.append(group)
            self.thread.join(30)
            assert not self.thread.is_alive()
            if self.error is not None:
                raise self.error

    def allreduce(data: torch.Tensor, proof: Any, **options: Any) -> Any:
        assert options.pop("engine") == "device"
        launched = options.pop("async_op", False)
        events.append(("launch" if launched else "call", state.steps, data.numel(), holds(data)))
        if launched:
            launches.append((state.steps, time.perf_counter()))
            return Launched(data, proof, options)
        return rounds(data, proof, **options)

    with (
        mock.patch.object(hook, "check_bucket", lambda state, buffer, in_call: None),  # CPU buckets here
        mock.patch.object(worker, "allreduce", allreduce),
        mock.patch.object(worker, "register_buffer", register_buffer),
    ):
        plain, hooked = twins(state, gradient_as_bucket_view=view)
        for i in range(steps):
            step(rank, i, plain, hooked, late(rank, n - 1, 0.2))
        connection = state.resources.connection
        assert connection is not None
        second = connection.reduce.groups[1]
        state.close()
    assert all(r.closed for r in held)
    assert all(group is second for group in waited), waited
    return events, len(waited), launches


@pytest.mark.parametrize(("asynchronous", "view"), [(True, False), (False, False), (True, True)])
def test_the_device_engine_registers_each_ddp_bucket_once_its_tensor_stays(
    asynchronous: bool, view: bool
) -> None:
    """DDP rebuilds its buckets once, before the second step; from then on every bucket's tensor is
    the same at every step (also where the gradients are views of it: ``view``), so the
    registration made at the second step holds every later call's bucket, on every rank alike.
    With the worker's threads, each bucket's second call on is launched by the first thread and
    waited for by the second, on the second group, and every punctual rank launches every bucket
    of a step before the late rank launches its first (their hidden phases run while it is away);
    in the call, every call is whole."""
    steps, n = 5, 3
    results = launch(device_path_rank, n, (asynchronous, view, steps), timeout=60)
    assert results[1][:2] == results[0][:2] == results[2][:2]
    events, waits, _ = results[0]
    sizes = (1339, 1640, 560)  # DDP's buckets from the second step on (see small_model)
    assert [e for e in events if e[1] == 1] == [("call", 1, sum(sizes), False)]  # before the rebuild
    assert [e for e in events if e[0] == "register"] == [("register", 2, size, False) for size in sizes]
    later = [e[:3] for e in events if e[0] != "register" and e[1] >= 2]
    settled = "launch" if asynchronous else "call"
    assert later == [
        ("call" if step == 2 else settled, step, size) for step in range(2, steps + 1) for size in sizes
    ]
    assert all(e[3] for e in events if e[0] != "register" and e[1] >= 2)  # the registration holds
    assert waits == (len(sizes) * (steps - 2) if asynchronous else 0)
    for step in range(3, steps + 1) if asynchronous else ():
        punctual = max(at for rank in range(n - 1) for s, at in results[rank][2] if s == step)
        assert punctual < min(at for s, at in results[n - 1][2] if s == step), step


def test_the_device_engine_refuses_a_cpu_bucket_and_a_machine_without_cupy() -> None:
    """In the hook, in one line, before any group is made or anything is gathered."""
    from unittest import mock

    from stragglar.ddp.options import check_bucket

    state = StragglarState(engine="device")
    with pytest.raises(
        InputError, match=r"StragglarState\(engine='device'\) reduces CUDA buckets, got one on cpu$"
    ):
        state.reduce(torch.zeros(4), 0, 2)
    assert state.resources.connection is None
    on_gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    with (
        mock.patch.object(importlib.util, "find_spec", lambda name: None),
        pytest.raises(InputError, match="launches its kernels with CuPy, which is not installed"),
    ):
        check_bucket(state, on_gpu, False)  # type: ignore[arg-type]


def test_graphs_off_is_refused_where_no_round_replays_from_a_graph() -> None:
    """graphs=False on CPU buckets over gloo was accepted, and meant nothing: every rank now
    refuses it at its first bucket, alike."""
    errors = launch(disagreeing_rank, 2, ({}, {"graphs": False}), timeout=30)
    words = "graphs applies to CUDA buckets on an NCCL group, whose rounds replay from CUDA graphs, "
    assert all(words + "not to a bucket on cpu over gloo" in e for e in errors), errors


def test_graphs_off_is_refused_on_fsdp_s_shards_whose_rounds_run_in_the_call() -> None:
    """FSDP's hook (``in_call``) queues its rounds in the call, one by one (a capture would stall
    it): no graph replays them, even for a CUDA shard on an NCCL group; the DDP hook's worker
    threads do replay them."""
    from unittest import mock

    from stragglar.ddp.options import check_bucket

    on_gpu = types.SimpleNamespace(is_cuda=True, device="cuda:0")
    state = StragglarState(graphs=False)
    with mock.patch.object(dist, "get_backend", lambda group: "nccl"):
        check_bucket(state, on_gpu, False)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="graphs applies to the DDP hook's worker threads, not to FSDP"):
            check_bucket(state, on_gpu, True)  # type: ignore[arg-type]


def test_a_cuda_bucket_reduced_in_the_call_is_ordered_on_its_device_s_streams(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """FSDP's hook (``in_call``) and ``asynchronous=False`` make no worker threads and run a bucket
    on the caller's thread; a CUDA bucket's job then carries its device's stream order (made once
    for the device: side streams after the event the gradients are ready at, a CUDA Future), not
    the host's, is marked as run on the caller (its rounds never from a graph), and the hook
    returns the job's own Future, which the reducer completes.  (How a stream-ordered job's
    stages run: tests/test_ddp_worker.py.)"""

    class Order:  # the stand-in of a device's StreamOrder
        stream_ordered = True

        def __init__(self, device: torch.device) -> None:
            made.append(device)

        def ready(self) -> str:
            return "the gradients' event"

        def future(self) -> torch.futures.Future[torch.Tensor]:
            return torch.futures.Future()

    class Reducer:  # the stand-in of the hook's reducer: it records the jobs it is given
        def __init__(self, *args: Any) -> None:
            pass

        def __call__(self, job: Any) -> None:
            jobs.append(job)

    from stragglar.ddp import hook

    made: list[torch.device] = []
    jobs: list[Any] = []
    monkeypatch.setattr(hook, "StreamOrder", Order)
    monkeypatch.setattr(hook, "Reducer", Reducer)
    monkeypatch.setattr(hook, "dedicated_group", lambda group, timeout: "the hook's group")
    monkeypatch.setattr(hook, "before_destroy", lambda *args: None)
    device = torch.device("cuda", 0)
    bucket = types.SimpleNamespace(is_cuda=True, device=device, numel=lambda: 8, element_size=lambda: 4)
    for asynchronous, in_call in ((True, True), (False, False)):  # FSDP's hook; DDP's synchronous path
        state = StragglarState(asynchronous=asynchronous)
        futures = [state.reduce(bucket, b, 4, in_call=in_call) for b in (0, 1)]  # type: ignore[arg-type]
        connection = state.resources.connection
        assert connection is not None and connection.worker is None
        assert list(connection.streams) == [device] and made.pop() == device and not made
        for bucket_number, (job, future) in enumerate(zip(jobs, futures, strict=True)):
            assert job.bucket == bucket_number and job.buffer is bucket and job.on_caller
            assert job.order is connection.streams[device] and job.ready == "the gradients' event"
            assert future is job.future and not future.done()  # the hook's, as the reducer completes it
        jobs.clear()
