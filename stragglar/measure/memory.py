"""Whether this host can hold a run, told before any rank starts or any data is made.

Started, a run's ranks fill the memory together, and the kernel's OOM killer ends one of them, or
another program of the user's, rather than the run failing with a word.  So ``run`` and ``bench``
refuse (exit 3) a run whose *certain* need is more than the memory available: what every rank
holds at once while the rounds run (its buffer and the copy it restores the buffer from, on the
host backends) and the reference sum the results are checked against.  The data's making, the
runtime's chunks in flight and each process's own libraries come on top (measured peaks, the
proportional set sizes of every process, were 1.1 to 2 times the certain need: 4 ranks of
256 MiB and 8 of 64 MiB, gloo and NumPy, the float dtypes), so a run that passes may still not
fit; one that is refused cannot.

The memory available is Linux's ``MemAvailable`` (what can be had without swapping), within what
the limits of this process's memory cgroups leave (a container's, a batch job's; v2 and v1, every
level up to the root), their page cache counted as free, as the kernel gives it back under
pressure.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from stragglar.errors import ResourceError
from stragglar.measure.data import ITEMSIZE
from stragglar.units import format_bytes

__all__ = ["available_memory", "check_host_memory", "host_bytes"]

NO_LIMIT = 2**62  # cgroup v1 writes "no limit" as the largest page multiple below 2**63
# the files of a cgroup's limit, usage and page cache (a key of memory.stat), by version
_V2 = ("memory.max", "memory.current", "file")
_V1 = ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_cache")


def host_bytes(num_ranks: int, count: int, dtype: str, *, on_host: bool) -> int:
    """The host memory a run of ``num_ranks`` buffers of ``count`` ``dtype`` elements certainly
    takes at once: the reference sum (int64, one, which the ranks share), and where the buffers are on
    the host (``on_host``: the local and torch backends) every rank's buffer and its copy.

    >>> format_bytes(host_bytes(4, 2**26, "float32", on_host=True))
    '2.5 GiB'
    >>> format_bytes(host_bytes(4, 2**26, "float32", on_host=False))
    '512 MiB'
    """
    per_rank = 2 * ITEMSIZE[dtype] if on_host else 0
    return count * 8 + num_ranks * count * per_rank


def available_memory(
    meminfo: str = "/proc/meminfo", cgroups: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """Bytes of memory this process may still take (see the module's docstring); None where
    nothing can be read."""
    known = []
    with contextlib.suppress(OSError, ValueError, IndexError), open(meminfo, encoding="ascii") as info:
        known += [int(line.split()[1]) * 1024 for line in info if line.startswith("MemAvailable:")]
    with contextlib.suppress(OSError, ValueError):
        lines = Path(cgroups).read_text(encoding="ascii").splitlines()
        for line in lines:
            hierarchy, controllers, path = line.split(":", 2)
            if hierarchy == "0" and not controllers:
                known += _rooms(Path(root), path, _V2)
            elif "memory" in controllers.split(","):
                known += _rooms(Path(root, "memory"), path, _V1)
    return min(known) if known else None


def _rooms(base: Path, path: str, names: tuple[str, str, str]) -> list[int]:
    """What each limited cgroup from ``path`` up to ``base`` leaves: its limit, less its usage,
    plus its page cache.  A path that is not under ``base`` (a cgroup namespace shows ``/``, or
    a path the mount does not show) starts at ``base``."""
    folder = base.joinpath(path.lstrip("/"))
    if not folder.is_dir():
        folder = base
    rooms = []
    while True:
        room = _room(folder, names)
        if room is not None:
            rooms.append(room)
        if folder == base or base not in folder.parents:
            return rooms
        folder = folder.parent


def _room(folder: Path, names: tuple[str, str, str]) -> int | None:
    limit_name, usage_name, cache_key = names
    with contextlib.suppress(OSError, ValueError, IndexError):
        limit = (folder / limit_name).read_text(encoding="ascii").strip()
        if limit == "max" or int(limit) >= NO_LIMIT:
            return None
        used = int((folder / usage_name).read_text(encoding="ascii"))
        stat = (folder / "memory.stat").read_text(encoding="ascii").splitlines()
        cache = next((int(line.split()[1]) for line in stat if line.split()[:1] == [cache_key]), 0)
        return max(0, int(limit) - used + cache)
    return None


def check_host_memory(
    num_ranks: int, count: int, dtype: str, *, on_host: bool, available: int | None = None
) -> None:
    """Refuse (:class:`~stragglar.errors.ResourceError`) a run whose :func:`host_bytes` are more
    than ``available`` (default :func:`available_memory`)."""
    if available is None:
        available = available_memory()
    need = host_bytes(num_ranks, count, dtype, on_host=on_host)
    if available is not None and need > available:
        what = f"{num_ranks} ranks of {_size(count * ITEMSIZE[dtype])} ({dtype})"
        holds = "their buffers, a copy of each and the reference sum" if on_host else "the reference sum"
        raise ResourceError(
            f"out of memory: {what} need at least {_size(need)} of host memory ({holds}), and "
            f"{_size(available)} is available: give a smaller size or fewer GPUs"
        )


def _size(size: int) -> str:
    """Bytes as memory is spoken of: exact where :func:`format_bytes` is short (``64 MiB``), else
    to a tenth of a GiB, or a whole MiB below one (99999 GiB is no whole number of a larger unit,
    and its bytes are 15 digits)."""
    exact = format_bytes(size)
    if not exact.endswith(" B") or size < 2**20:
        return exact
    if size < 2**30:
        return f"{size / 2**20:,.0f} MiB"
    return f"{size / 2**30:,.1f}".removesuffix(".0") + " GiB"
