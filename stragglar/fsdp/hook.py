"""FSDP2's all-reduce hook, served by a :class:`~stragglar.ddp.StragglarState`.

With HSDP, FSDP2 reduce-scatters each parameter group's gradients within its shard group, then
all-reduces the shard across the replicas.  On a model sharded over the shard dimension only,
``FSDPModule.set_all_reduce_hook`` hands that shard to a hook instead, which must reduce it across
the replicas itself; :func:`use_stragglar` installs one that does it as the DDP hook reduces a
bucket (:meth:`~stragglar.ddp.StragglarState.reduce`).

What FSDP divides by, and so what the hook must.  FSDP divides the reduce-scatter by its group's
size (or, with ``set_gradient_divide_factor(F)``, the whole reduction by F), before or after the
hook as the dtype asks (``_get_gradient_divide_factors`` in torch's ``_fsdp_collectives``); native
HSDP divides by replicas x shards.  So the hook averages over the replicas, and with a divide
factor set it sums: either way the gradients are native HSDP's with the same settings.

FSDP reads the shard as soon as the hook returns (it divides it, casts it, views it as the
gradients), so the reduction runs in the call (the DDP hook's synchronous path): on CPU it
blocks, as FSDP's own all-reduce does there.  On CUDA FSDP calls the hook with its all-reduce
stream current, and the call queues the rounds on the state's two side streams after it (the
rounds the late replica takes no part in, then the rest), divides there, and makes the
all-reduce stream wait for them on the device: over NCCL the host waits for no round, and goes on
with the backward while the replicas reduce, as with FSDP's own all-reduce (a shard's rounds
follow the last shard's, which FSDP's all-reduce stream orders; a silent peer is NCCL's
watchdog's to end, at the state's ``timeout``).  The shard is kept from the allocator until the
side streams' work on it has run (FSDP frees it at each step).  The rounds are launched one by
one, never from a CUDA graph: a capture synchronizes the device, which would stall the backward
in the call.  So ``asynchronous`` (the DDP hook's worker threads) has nothing to choose here, and
``graphs=False`` is refused.  With ``engine="device"`` a shard is one kernel launch a replica,
staged through the receivers' inboxes, which the host waits for: FSDP hands a new shard tensor at
each step, which registering would not serve.

FSDP keeps no public count of a module's parameter groups nor their meshes: the checks read
them where ``set_all_reduce_hook`` does, in the module's FSDP state.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from stragglar.ddp.agreement import check_channel, dtype_code, dtype_name, holders
from stragglar.ddp.hook import StragglarState
from stragglar.ddp.worker import named_globally
from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime import MismatchError, RankError
from stragglar.runtime.header import ranks_in_words
from stragglar.runtime.torch_dist import check_group, gather_headers

__all__ = ["ReplicaReduction", "use_stragglar"]


@dataclass
class Marks:
    """What the hooks of one module share.

    ``pending``: the next reduction begins a step; set by each forward of the module, and before
    the first (FSDP calls the hooks of a step one after another, in the order of backward).
    ``checked``: the parameter groups (their ``index``) whose shards this process has checked
    against every replica's, at each one's first reduction.  ``partial``: a group's shards summed
    over the backward passes FSDP asked not to all-reduce (``set_requires_all_reduce(False)``,
    HSDP's gradient accumulation), added into the next one it does, as native HSDP does."""

    pending: bool = True
    checked: set[int] = field(default_factory=set)
    partial: dict[int, torch.Tensor] = field(default_factory=dict)

    def begin(self, *_: Any) -> None:
        """A forward pre-hook: the next reduction begins a step."""
        self.pending = True

    def take(self) -> bool:
        pending, self.pending = self.pending, False
        return pending


@dataclass(frozen=True)
class ReplicaReduction:
    """The all-reduce hook of one FSDP parameter group: it reduces the group's shard of the
    gradients across the replicas with ``state``.

    ``index``: the group's number among those hooked, the tag of its reductions.  ``param_group``:
    FSDP's parameter group, whose divide factor is read at each call (it may be set later).
    ``shard``: this rank's shard of the group's parameters, (index, count), which every replica
    must hold alike.  ``owner``: the FSDP module of the group.  ``marks``: what the module's hooks
    share."""

    state: StragglarState
    index: int
    param_group: Any
    shard: tuple[int, int]
    owner: FSDPModule
    marks: Marks

    def __call__(self, reduce_output: torch.Tensor) -> None:
        state, marks = self.state, self.marks
        replicas = dist.get_world_size(state.process_group)
        if replicas > 1 and not self.param_group.all_reduce_grads:  # a backward of an accumulation
            held = marks.partial.get(self.index)
            if held is None:
                marks.partial[self.index] = reduce_output.clone()
            else:
                held += reduce_output
            reduce_output.zero_()  # FSDP adds it to the gradients: nothing yet
            return
        if marks.take():
            if state.resources.steps_run == 0 and replicas > 1:  # this process's first, resumed too
                _check_every_group_served(self.owner, state.process_group)
                try:
                    state.agree(replicas, reduce_output.device, "HSDP replicas", "the replicate group")
                except RankError as e:  # a silent or dead replica, named by its global rank too
                    raise named_globally(e, state.process_group) from None
            state.new_step(replicas)
        if replicas == 1:
            state.late_rank(replicas)  # a straggler that is no replica is still an error
            return
        if self.index not in marks.checked:
            _check_replicas(self.shard, reduce_output, state.process_group, state.timeout)
            marks.checked.add(self.index)
        held = marks.partial.pop(self.index, None)
        if held is not None:
            reduce_output += held
        divisor = replicas if self.param_group.gradient_divide_factor is None else 1
        state.reduce(reduce_output, self.index, replicas, divisor=divisor, in_call=True).wait()


def use_stragglar(module: torch.nn.Module, state: StragglarState, *, replicate_group: Any) -> int:
    """Reduce every ReduceScatter output of the FSDP modules in ``module`` across
    ``replicate_group`` with ``state``; returns how many parameter groups it serves.

    ``module`` is sharded with ``fully_shard`` over the shard dimension of a 2-D mesh only, and
    ``replicate_group`` is the mesh's replicate dimension's group (``mesh["replicate"].get_group()``)
    with this rank in it.  The state serves that group from then on (its ``process_group``: None
    or that group).  The gradients are native HSDP's (``fully_shard`` on the 2-D mesh) with the
    same settings, up to the order of the additions.  The first step checks that the hook serves
    every parameter group sharded over this rank's shard group and that every replica runs it with
    the same settings; each group's first reduction, that every replica holds the same shard, of
    the same size and dtype."""
    if not isinstance(module, torch.nn.Module):
        raise ArgumentError(f"use_stragglar needs a torch module, got {described(module)}")
    if not isinstance(state, StragglarState):
        raise ArgumentError(f"use_stragglar needs a stragglar.ddp.StragglarState, got {described(state)}")
    check_group(replicate_group, "replicate_group", world=False)
    if state.process_group is not None and state.process_group is not replicate_group:
        raise InputError(
            "the state serves another process group than replicate_group: give it one or the other"
        )
    served = list(_param_groups(module))
    if not served:
        raise InputError(
            "the module has no parameters sharded with fully_shard: "
            "shard it over the mesh's shard dimension first"
        )
    for name, _, group in served:
        if isinstance(getattr(group, "_all_reduce_hook", None), ReplicaReduction):
            raise InputError(
                f"use_stragglar already serves {_named(name)}: call it once, on the root module, "
                "with one state (a second would replace the first's hooks, not its step count)"
            )
    members = dist.get_process_group_ranks(replicate_group)
    _check_straggler(state, members)
    shards = [_shard(name, group, set(members)) for name, _, group in served]  # all checked, then hooked
    state.process_group = replicate_group
    marks = Marks()
    for index, ((_, owner, group), shard) in enumerate(zip(served, shards, strict=True)):
        owner.set_all_reduce_hook(ReplicaReduction(state, index, group, shard, owner, marks))
    module.register_forward_pre_hook(marks.begin)
    return len(served)


def _check_straggler(state: StragglarState, members: list[int]) -> None:
    """The state's straggler, a replica's index in the replicate group (not a global rank), checked
    when the hook is set up rather than in the first backward."""
    straggler = state.straggler
    if straggler is not None and not 0 <= straggler < len(members):
        raise InputError(
            f"StragglarState.straggler is {straggler}: it is a replica's index in replicate_group, "
            f"0..{len(members) - 1} (its global ranks, in order: {_listed(members)})"
        )


def _listed(ranks: list[int], limit: int = 8) -> str:
    return ", ".join(map(str, ranks[:limit])) + (", ..." if len(ranks) > limit else "")


def _param_groups(module: torch.nn.Module) -> Iterator[tuple[str, FSDPModule, Any]]:
    """Each FSDP module's parameter group, with the module's name: refused where it has several
    (``set_all_reduce_hook`` serves one)."""
    for name, sub in module.named_modules():
        if not isinstance(sub, FSDPModule):
            continue
        groups = sub._get_fsdp_state()._fsdp_param_groups
        if len(groups) > 1:
            raise InputError(
                f"{_named(name)} has {len(groups)} parameter groups (meshes of its own from "
                "shard_placement_fn), and FSDP's all-reduce hook serves a module with one"
            )
        for group in groups:
            yield name, sub, group


def _shard(name: str, group: Any, replicas: set[int]) -> tuple[int, int]:
    """This rank's shard of ``group``'s parameters, (index, count), once its mesh is checked
    against the replicate group's ranks ``replicas``."""
    mesh_info = group.mesh_info
    if getattr(mesh_info, "replicate_process_group", None) is not None:
        raise InputError(
            f"{_named(name)} is sharded over a 2-D mesh, whose replicas FSDP all-reduces itself: "
            "shard it with fully_shard(module, mesh=mesh['shard']) and give "
            "replicate_group=mesh['replicate'].get_group()"
        )
    shard_ranks = set(dist.get_process_group_ranks(mesh_info.shard_process_group))
    shared = shard_ranks & replicas
    if shared != {dist.get_rank()}:
        raise InputError(
            f"replicate_group is not the replicate group of the shards of {_named(name)}: it shares "
            f"{ranks_in_words(shared)} with the shard group, "
            f"where a replicate group shares this rank ({dist.get_rank()}) alone"
        )
    return int(mesh_info.shard_mesh_rank), int(mesh_info.shard_mesh_size)


def _named(name: str) -> str:
    return f"module {name!r}" if name else "the module"


def _check_every_group_served(owner: FSDPModule, replicate_group: Any) -> None:
    """Refuse, at the first step, a parameter group of the model that shards over this rank's shard
    group with no all-reduce across the replicas: neither FSDP's (a 2-D mesh) nor this hook's (a
    module ``use_stragglar`` was not given, or one sharded after it was called).  Its gradients
    would be each replica's own, the replicas' parameters would drift apart, and nothing would
    say so.  The groups are FSDP's root state's, known once its first forward ran."""
    states = getattr(getattr(owner._get_fsdp_state(), "_state_ctx", None), "all_states", ())
    replicas = set(dist.get_process_group_ranks(replicate_group))
    for state in states:
        for group in state._fsdp_param_groups:
            if isinstance(getattr(group, "_all_reduce_hook", None), ReplicaReduction):
                continue
            mesh_info = group.mesh_info
            if getattr(mesh_info, "replicate_process_group", None) is not None:
                continue  # native HSDP: FSDP all-reduces it
            if set(dist.get_process_group_ranks(mesh_info.shard_process_group)) & replicas == {
                dist.get_rank()
            }:
                name = getattr(group, "_module_fqn", "") or ""
                raise InputError(
                    f"{_named(name)} is sharded over this rank's shard group and use_stragglar does "
                    "not serve it: its gradients would not be reduced across the replicas; call "
                    "use_stragglar on the root module, after fully_shard"
                )


def _check_replicas(shard: tuple[int, int], reduce_output: torch.Tensor, group: Any, timeout: float) -> None:
    """Raise the same :class:`~stragglar.runtime.MismatchError` on every rank of ``group`` unless
    all hold the same shard (index, count) of the parameters, of the same size and dtype: a group
    across shards, not replicas, would add up different parameters' gradients, and replicas of
    other models would fail in the reduction (the engine's all_reduce, under ``auto``, aborted the
    process).  One gather, at a parameter group's first reduction."""
    row = [*shard, reduce_output.numel(), dtype_code(reduce_output)]
    during = "checking that the HSDP replicas hold the same shard"
    try:  # a silent replica is named by those that waited for it (on gloo), by its global rank too
        rows = gather_headers(
            row, group, reduce_output.device, dist.get_rank(group), timeout, check_channel(group), during
        )
    except RankError as e:
        raise named_globally(e, group) from None
    ranks = dist.get_process_group_ranks(group)
    shards = holders(ranks, [(row[0], row[1]) for row in rows])
    if len(shards) > 1:
        held = "; ".join(
            f"{ranks_in_words(members)} {'hold' if len(members) > 1 else 'holds'} shard {i} of {n}"
            for (i, n), members in shards
        )
        raise MismatchError(
            f"replicate_group's ranks hold different shards, so it is no replicate group: {held}"
        )
    sizes = holders(ranks, [(row[2], row[3]) for row in rows])
    if len(sizes) > 1:
        said = "; ".join(
            f"{ranks_in_words(members)}: {count:,} elements of {dtype_name(code)}"
            for (count, code), members in sizes
        )
        raise MismatchError(f"HSDP replicas reduce shards of other sizes or dtypes (global ranks): {said}")
