"""The checks a :class:`~stragglar.ddp.StragglarState`'s options pass when it is made, and the one
its first bucket passes on the device engine.

Each option is checked in the terms a user gave it (``straggler=1.5`` or ``True`` is an
:class:`~stragglar.runtime.ArgumentError`, a NumPy integer is a fine rank), and normalized on the
state; an option that does not apply to the others given is an error in one line, never ignored.
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from stragglar.args import MAX_DELAY, as_flag, as_int, as_seconds
from stragglar.ddp.probe import LateRankProbe
from stragglar.ddp.worker import DEVICE
from stragglar.errors import ArgumentError, InputError, described, shown
from stragglar.files import check_appendable, same_file
from stragglar.model import AUTO, Network
from stragglar.model.detect import Rule
from stragglar.model.policy import POLICIES, STRAGGLAR
from stragglar.runtime import ENGINES
from stragglar.runtime.torch_dist import check_group
from stragglar.synth import ALGORITHMS

if TYPE_CHECKING:
    from stragglar.ddp.hook import StragglarState

__all__ = ["check_bucket", "check_fresh_trace", "check_learned", "check_options"]


def check_options(state: StragglarState) -> None:
    """Check and normalize ``state``'s options, as its constructor was given them."""
    if not isinstance(state.algorithm, str) or state.algorithm not in ALGORITHMS:
        raise InputError(
            f"StragglarState.algorithm must be one of {', '.join(ALGORITHMS)}, "
            f"got {described(state.algorithm)}"
        )
    if not isinstance(state.policy, str) or state.policy not in POLICIES:
        raise InputError(
            f"StragglarState.policy must be one of {', '.join(POLICIES)}, got {described(state.policy)}"
        )
    if state.policy == "auto" and state.algorithm == "ring":  # the model prices the engine as a Ring
        raise InputError(
            "StragglarState: policy='auto' bets on the algorithm where it beats the engine's own "
            "all_reduce, priced as a Ring, so algorithm='ring' would never run: use policy='stragglar'"
        )
    if state.straggler is not None:
        state.straggler = as_int(state.straggler, "StragglarState.straggler", minimum=0)
    state.timeout = as_seconds(state.timeout, "StragglarState.timeout", positive=True)
    state.straggler_delay = as_seconds(
        state.straggler_delay, "StragglarState.straggler_delay", maximum=MAX_DELAY
    )
    state.detect = as_int(state.detect, "StragglarState.detect", minimum=0)
    if not isinstance(state.rule, Rule):
        raise ArgumentError(
            f"StragglarState.rule must be a stragglar.model.detect.Rule, got {described(state.rule)}"
        )
    if state.network is not None and not isinstance(state.network, Network):
        raise ArgumentError(
            f"StragglarState.network must be a stragglar.model.Network, got {described(state.network)}"
        )
    as_flag(state.asynchronous, "StragglarState.asynchronous")
    check_group(state.process_group, "StragglarState.process_group")
    as_flag(state.graphs, "StragglarState.graphs")
    if state.engine not in ENGINES:
        raise InputError(
            f"StragglarState.engine must be one of {', '.join(ENGINES)}, got {described(state.engine)}"
        )
    if state.engine == DEVICE and not state.graphs:
        raise InputError(
            "StragglarState.graphs applies to the rounds engine, not to engine 'device' "
            "(one kernel launch a bucket)"
        )
    if not state.asynchronous and not state.graphs:
        raise InputError(
            "StragglarState.graphs applies to the worker threads' rounds, not to asynchronous=False, "
            "whose rounds run in the hook and never from a graph (a capture would stall it)"
        )
    if state.record is not None and (
        not isinstance(state.record, (str, os.PathLike)) or not os.fspath(state.record)
    ):
        raise ArgumentError(
            f"StragglarState.record must name a file (a str or path), got {described(state.record)}"
        )
    if state.record is not None:  # on every rank, now: rank 0 writes from step 3 on
        check_appendable(state.record, "traces")
    if state.metrics is not None and (
        not isinstance(state.metrics, (str, os.PathLike)) or not os.fspath(state.metrics)
    ):
        raise ArgumentError(
            f"StragglarState.metrics must name a file (a str or path), got {described(state.metrics)}"
        )
    if state.metrics is not None:
        check_appendable(state.metrics, "metrics")
    if state.record is not None and state.metrics is not None and same_file(state.record, state.metrics):
        raise InputError(
            f"StragglarState.record and metrics name one file ({shown(os.fspath(state.metrics))}): "
            "the metrics, replaced at every step, would wipe the trace; give each a file of its own"
        )
    _check_chunks(state)
    _check_network(state)
    if state.policy == "auto" and state.straggler_delay:
        raise InputError(
            "StragglarState.straggler_delay is for experiments with policy='stragglar': the auto "
            "policy judges how late ranks really arrive, and a delay inside the reduction is not seen"
        )


def check_learned(proofs: object, switches: object, decisions: object, steps: object, probe: object) -> int:
    """Check what a state is given of another's learning (its proofs, switches, decisions, steps
    and probe), each of its type: a wrong one failed only inside the hook, at the first bucket
    (``proofs=[1]``: "list indices must be integers").  Returns ``steps`` as an int."""
    for name, value, kind, what in (
        ("proofs", proofs, dict, "a dict of proofs"),
        ("switches", switches, list, "a list of (step, rank) pairs"),
        ("decisions", decisions, list, "a list of decisions"),
        ("probe", probe, LateRankProbe, "a stragglar.ddp.probe.LateRankProbe"),
    ):
        if value is not None and not isinstance(value, kind):
            raise ArgumentError(f"StragglarState.{name} must be {what} or None, got {described(value)}")
    return as_int(steps, "StragglarState.steps", minimum=0)


def _check_chunks(state: StragglarState) -> None:
    if state.chunks is None:
        return
    if state.algorithm != STRAGGLAR:
        raise InputError(f"StragglarState.chunks shapes StragglAR, not {state.algorithm}")
    if state.chunks != AUTO:
        if isinstance(state.chunks, str):
            raise InputError(
                f"StragglarState.chunks must be a chunk count or 'auto', got {described(state.chunks)}"
            )
        state.chunks = as_int(state.chunks, "StragglarState.chunks", minimum=1)
    elif state.policy != "auto" and state.network is None:
        raise InputError(
            "StragglarState.chunks='auto' prices chunk counts on a network: give network= "
            "(a stragglar.model.Network) or use policy='auto', which fits one"
        )


def _check_network(state: StragglarState) -> None:
    """Under policy "stragglar" a network prices nothing but ``chunks="auto"``'s counts: given
    without it, it would be ignored."""
    if state.network is not None and state.policy != "auto" and state.chunks != AUTO:
        advice = "give chunks='auto' or leave network out" if state.algorithm == STRAGGLAR else "leave it out"
        raise InputError(
            "StragglarState.network prices the auto policy's choices and chunks='auto''s counts; "
            f"under policy='stragglar' with algorithm={state.algorithm!r} and chunks="
            f"{described(state.chunks)} it prices nothing: {advice}"
        )


def check_bucket(state: StragglarState, buffer: torch.Tensor, in_call: bool) -> None:
    """Refuse, in the hook, a bucket the state's options do not fit: on the device engine, one on
    the CPU, or any where CuPy, which launches the kernels, is not installed; with
    ``graphs=False``, one whose rounds never replay from CUDA graphs (only a CUDA bucket on an
    NCCL group does, on the worker threads: not ``in_call``, whose rounds run in the call, where a
    capture would stall the caller), where the option would be ignored.  The backend is known
    only here."""
    if state.engine == DEVICE:
        if not buffer.is_cuda:
            raise InputError(
                f"StragglarState(engine='device') reduces CUDA buckets, got one on {buffer.device}"
            )
        if importlib.util.find_spec("cupy") is None:
            raise InputError(
                "StragglarState(engine='device') launches its kernels with CuPy, which is not "
                "installed (the cuda12 or cuda13 extra)"
            )
    if not state.graphs:
        backend = dist.get_backend(state.process_group)
        if not buffer.is_cuda or backend != "nccl":
            raise InputError(
                "StragglarState.graphs applies to CUDA buckets on an NCCL group, whose rounds "
                f"replay from CUDA graphs, not to a bucket on {buffer.device} over {backend}"
            )
        if in_call:
            raise InputError(
                "StragglarState.graphs applies to the DDP hook's worker threads, not to FSDP's "
                "hook, whose rounds run in its call and never from a graph"
            )


def check_fresh_trace(record: str | os.PathLike[str] | None, steps: int) -> None:
    """Refuse a ``record`` file that holds a trace already, for a run from step 1 (``steps`` 0):
    its rows would repeat the steps there, and a reader (``stragglar whatif``) refuses such a
    file; found when the state is built, not after training.  A resumed run (``steps`` > 0)
    appends after them."""
    if record is None or steps > 0:
        return
    try:
        size = os.stat(record).st_size
    except OSError:  # missing: the first run into it
        return
    if size > 0:
        raise InputError(
            f"StragglarState.record: {shown(os.fspath(record))} holds a trace already, whose steps a "
            "run from step 1 would repeat: name a new file, or give steps= to resume after them"
        )
