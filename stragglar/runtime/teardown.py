"""Finish stragglar's own work on a torch process group before torch destroys the group.

Some of what stragglar makes outlives the call that made it, and a group destroyed under it does
not end cleanly:

* a CUDA graph of NCCL rounds holds its communicator, and NCCL will not destroy a communicator
  that a live graph holds: ``destroy_process_group()`` then waits for ever;
* the DDP hook's late-rank probe posts one small all_gather per step and reads it a step later, so
  the last step's is still in flight when training ends, and gloo aborts the whole process
  ("terminate called without an active exception") when a group is destroyed with work in flight;
* the DDP hook's worker threads may still be handing back the last bucket.

PyTorch offers no callback before a group is destroyed, so the first time stragglar makes one of
these, :func:`install` wraps ``torch.distributed.destroy_process_group``: the wrapper first runs
what was registered for the group being destroyed (:func:`before_destroy`; every group when it is
given none), each bounded and none able to stop the destroy, and drops this process's CUDA graphs
on it, then calls torch's own. A script written the way PyTorch's documentation shows (train, then
``destroy_process_group()``, no barrier and no release) so ends cleanly. One that never destroys
its groups gets the same work as the interpreter exits, where the hook's own gloo operations are
kept and waited for until gloo's threads let go of them (a gloo thread that takes the GIL as the
interpreter finalizes aborts the process: ``StragglarState.close``); the explicit calls
(:func:`~stragglar.runtime.release_graphs`, ``StragglarState.close()``) stay for a program that
wants the order in its own hands.
"""

from __future__ import annotations

import atexit
import functools
import threading
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stragglar.runtime.graphs import release

__all__ = ["before_destroy", "finish", "install"]

_MARK = "__stragglar_finishes_first__"  # set on the wrapper, so it is never wrapped twice


@dataclass(frozen=True)
class _Finisher:
    """What to run before ``groups`` go: ``work(owner)``, while ``owner`` lives."""

    owner: weakref.ref[Any]
    groups: tuple[Any, ...]
    work: Callable[[Any], object]


_finishers: list[_Finisher] = []
_lock = threading.Lock()


def before_destroy(owner: object, groups: tuple[Any, ...], work: Callable[[Any], object]) -> None:
    """Run ``work(owner)`` before any of ``groups`` is destroyed (or all groups are), as long as
    ``owner`` lives; it is held weakly, so registering keeps nothing alive.  Installs the wrapper."""
    with _lock:
        _finishers[:] = [f for f in _finishers if f.owner() is not None]
        _finishers.append(_Finisher(weakref.ref(owner), tuple(groups), work))
    install()


def finish(group: Any = None) -> None:
    """Run what was registered for ``group`` (None: for every group), then drop this process's
    CUDA graphs on it; a failure is a warning, since the group is going anyway."""
    with _lock:
        due = [f for f in _finishers if group is None or any(g is group for g in f.groups)]
        _finishers[:] = [f for f in _finishers if f not in due and f.owner() is not None]
    for finisher in due:
        owner = finisher.owner()
        if owner is not None:
            _warned(finisher.work, owner)
    _warned(release, group)


def _warned(work: Callable[[Any], object], argument: Any) -> None:
    try:
        work(argument)
    except Exception as e:
        warnings.warn(
            f"stragglar: could not finish its work before the process group went: {e}",
            RuntimeWarning,
            stacklevel=3,
        )


def install() -> None:
    """Wrap ``torch.distributed.destroy_process_group`` (once) so that :func:`finish` runs first.

    Both names torch offers are replaced (``torch.distributed`` and its ``distributed_c10d``);
    a script that bound the function to a name of its own before stragglar ran keeps torch's."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    with _lock:
        original = c10d.destroy_process_group
        if getattr(original, _MARK, False):
            return

        @functools.wraps(original)
        def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
            finish(args[0] if args else kwargs.get("group"))
            return original(*args, **kwargs)

        setattr(destroy_process_group, _MARK, True)
        c10d.destroy_process_group = destroy_process_group
        if getattr(dist, "destroy_process_group", None) is original:
            dist.destroy_process_group = destroy_process_group
        atexit.register(_at_exit)


def _at_exit() -> None:
    """A script that never destroys its groups: what was registered runs as the interpreter
    exits, before torch's groups go with it (the probe's last gather in flight aborted such a
    script now and then)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        finish()
