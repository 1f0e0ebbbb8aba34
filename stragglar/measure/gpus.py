"""Where the ``nccl`` backend's ranks run: rank r on GPU r mod the GPU count.

NCCL refuses two ranks of one host on one GPU ("Duplicate GPU detected").  It decides "one host"
from ``NCCL_HOSTID`` where that is set, so where ranks outnumber the GPUs every rank gets a host
id of its own: NCCL then takes the ranks for one-GPU hosts and moves their data over its socket
transport, on the loopback (``NCCL_SOCKET_IFNAME=lo``), instead of NVLink or PCIe.  The results
are as real as any; the times are not a GPU interconnect's (TCP over loopback, and the ranks of
one GPU take turns on it), which is what :func:`sharing_note` tells the reader.

The GPUs are counted without initialising CUDA in this process: the launcher forks its ranks
afterwards, and a CUDA context made before a fork is unusable in the children.
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.errors import InputError

__all__ = ["Placement", "check_cuda", "gpu_count", "placement", "sharing_note"]


@dataclass(frozen=True)
class Placement:
    """One NCCL rank's GPU (an index among the visible ones) and the environment it must start
    with (set before the process group is made; empty where the rank has a GPU to itself)."""

    device: int
    env: dict[str, str]


def placement(rank: int, world_size: int, gpus: int) -> Placement:
    """Rank ``rank`` of ``world_size`` on ``gpus`` GPUs: GPU ``rank % gpus``, and where ranks share
    a GPU its own ``NCCL_HOSTID`` and the loopback for NCCL's sockets.

    >>> placement(5, 8, 4)
    Placement(device=1, env={'NCCL_HOSTID': 'host-5', 'NCCL_SOCKET_IFNAME': 'lo'})
    >>> placement(1, 4, 8)
    Placement(device=1, env={})
    """
    if gpus < 1 or not 0 <= rank < world_size:
        raise ValueError(f"no placement for rank {rank} of {world_size} on {gpus} GPUs")
    if world_size <= gpus:
        return Placement(rank, {})
    return Placement(rank % gpus, {"NCCL_HOSTID": f"host-{rank}", "NCCL_SOCKET_IFNAME": "lo"})


def sharing_note(world_size: int, gpus: int, backend: str = "nccl") -> str | None:
    """What a report says once where ranks share GPUs (None where each rank has its own): on the
    nccl backend their messages go over NCCL's sockets, on the device backend their kernels reach
    each other's memory on the GPU; either way they take turns on it."""
    if world_size <= gpus:
        return None
    if backend == "device":
        how = "reach each other's memory through CUDA IPC (their headers over NCCL's socket transport)"
    else:
        how = "talk over NCCL's socket transport on the loopback"
    return (
        f"note: more ranks than the {gpus} GPU{'s' * (gpus > 1)} here: ranks that share a GPU run as "
        f"separate hosts (NCCL_HOSTID per rank) and {how}, "
        "taking turns on the GPU: results are checked as ever, the times are indicative only"
    )


def gpu_count() -> int:
    """The CUDA GPUs torch sees (0 for a torch built without CUDA, or no torch), counted through
    NVML, which makes no CUDA context here; where NVML cannot count them torch asks CUDA itself,
    and the forked ranks may then fail to start CUDA (each says so, and the run fails with exit 1)."""
    try:
        import torch
    except ImportError:
        return 0

    return int(torch.cuda.device_count())


def check_cuda(backend: str) -> int:
    """The GPU count for ``backend`` (``nccl`` or ``device``, whose ranks are CUDA processes); an
    InputError naming it, before any work, where there is none."""
    count = gpu_count()
    if count < 1:
        raise InputError(
            f"the {backend} backend needs CUDA GPUs: torch sees none (torch.cuda.device_count() is 0)"
        )
    return count
