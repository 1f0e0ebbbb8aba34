"""Before its first step, every rank checks that its hook runs with the others' settings.

The hook's reductions are ``lockstep`` calls of the runtime (:mod:`stragglar.runtime.channels`):
every rank must issue the same calls in the same order, which holds when every rank's state
decides alike.  A rank with another policy, algorithm or straggler would issue other calls, one
with another ``asynchronous`` would create another number of groups (a collective every rank must
join), one with another ``engine`` would gather other things at other times, one with another
``detect`` (or ``record``, or ``metrics``) would probe where the others do not, one with another
``straggler_delay`` would price other chunk counts under ``chunks="auto"``: the others would wait
for it until the timeout, with no word on why.  So at its first step every rank all-gathers its
settings on DDP's group, once, and every rank raises the same one-line
:class:`~stragglar.runtime.MismatchError` that names what differs.

>>> mine = {"policy": "auto", "algorithm": "stragglar", "asynchronous": True, "engine": "rounds",
...         "detect": 0, "rule": Rule(), "chunks": "auto", "network": None, "straggler": None,
...         "straggler_delay": 0.0, "graphs": True, "record": False, "metrics": False}
>>> row = encode(mine)
>>> decode(row) == mine
True
>>> other = encode({**mine, "policy": "stragglar", "chunks": 12})
>>> disagreement([row, other, row]).split(": ", 1)[1]
"policy: ranks 0, 2 have 'auto', rank 1 has 'stragglar'; chunks: ranks 0, 2 have 'auto', rank 1 has 12"
>>> disagreement([row, other], "HSDP replicas", "the replicate group").split(":")[0]
'HSDP replicas run the hook with other settings'
>>> disagreement([[0] + row[1:], row], "HSDP replicas", "the replicate group")
'rank 0 sent no hook settings: is another collective running on the replicate group?'
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from enum import IntEnum
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from stragglar.model import AUTO, Network
from stragglar.model.detect import Rule
from stragglar.model.policy import POLICIES
from stragglar.runtime import DTYPES, ENGINES, MismatchError
from stragglar.runtime.header import ranks_in_words as rank_list
from stragglar.runtime.torch_dist import gather_headers
from stragglar.schedule import ALGORITHMS

__all__ = [
    "FIELDS",
    "agree",
    "agree_on_bucket",
    "check_channel",
    "decode",
    "disagreement",
    "dtype_code",
    "dtype_name",
    "encode",
    "holders",
    "settings_of",
]

MAGIC = 0x53_54_44_44_50  # "STDDP": a row from anything else is not this check's
BUCKET_MAGIC = 0x53_54_42_4B_54  # "STBKT": a bucket's row (agree_on_bucket)


class Code(IntEnum):
    """What a row holds for a setting that is no number (no rank or chunk count is negative)."""

    NOT_GIVEN = -1  # chunks or straggler: None
    CHUNKS_AUTO = -2  # chunks: "auto"


def _bits(value: float) -> int:
    """A float's IEEE bits as a signed 64-bit integer, so that rows are integers only."""
    return int(struct.unpack("<q", struct.pack("<d", value))[0])


def _float(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<q", bits))[0])


def _coded(value: Any) -> list[int]:
    """A chunk option or a straggler (None, "auto" or a number) as one integer."""
    if value is None:
        return [Code.NOT_GIVEN]
    return [Code.CHUNKS_AUTO if value == AUTO else int(value)]


def _uncoded(row: Sequence[int]) -> Any:
    return None if row[0] == Code.NOT_GIVEN else AUTO if row[0] == Code.CHUNKS_AUTO else row[0]


def _network(value: Network | None) -> list[int]:
    return [0, 0, 0] if value is None else [1, _bits(value.alpha), _bits(value.bandwidth)]


def _unnetwork(row: Sequence[int]) -> Network | None:
    return Network(_float(row[1]), _float(row[2])) if row[0] else None


def _rule(value: Rule) -> list[int]:
    return [_bits(value.false_alarm), _bits(value.share), _bits(value.margin)]


def _unrule(row: Sequence[int]) -> Rule:
    return Rule(_float(row[0]), _float(row[1]), _float(row[2]))


# name -> (width, encode, decode): each setting as integers, and back
Codec = tuple[int, Callable[[Any], list[int]], Callable[[Sequence[int]], Any]]
FIELDS: dict[str, Codec] = {
    "policy": (1, lambda v: [POLICIES.index(v)], lambda r: POLICIES[r[0]]),
    "algorithm": (1, lambda v: [ALGORITHMS.index(v)], lambda r: ALGORITHMS[r[0]]),
    "asynchronous": (1, lambda v: [int(v)], lambda r: bool(r[0])),
    "engine": (1, lambda v: [ENGINES.index(v)], lambda r: ENGINES[r[0]]),  # the device engine's calls differ
    "detect": (1, lambda v: [int(v)], lambda r: r[0]),
    "rule": (3, _rule, _unrule),
    "chunks": (1, _coded, _uncoded),
    "network": (3, _network, _unnetwork),
    "straggler": (1, _coded, _uncoded),
    "straggler_delay": (1, lambda v: [_bits(v)], lambda r: _float(r[0])),
    "graphs": (1, lambda v: [int(v)], lambda r: bool(r[0])),  # refused alike where it does not apply
    "record": (1, lambda v: [int(v)], lambda r: bool(r[0])),  # a trace is recorded: the probe runs
    "metrics": (1, lambda v: [int(v)], lambda r: bool(r[0])),  # metrics are written: the probe runs
}


def encode(settings: Mapping[str, Any]) -> list[int]:
    """A rank's settings (every key of :data:`FIELDS`, as the state checked them) as one row."""
    row = [MAGIC]
    for name, (_, to_row, _) in FIELDS.items():
        row += to_row(settings[name])
    return row


def decode(row: Sequence[int]) -> dict[str, Any]:
    """The settings an :func:`encode` row holds."""
    settings, at = {}, 1
    for name, (width, _, from_row) in FIELDS.items():
        settings[name] = from_row(row[at : at + width])
        at += width
    return settings


def disagreement(
    rows: Sequence[Sequence[int]], ranks: str = "DDP ranks", group: str = "DDP's group"
) -> str | None:
    """What the ranks' settings (one row per rank, in rank order) disagree on, in one line; None
    where they all agree.  ``ranks`` and ``group`` name, in the line, the ranks whose hooks run
    together and the group they gathered their settings on."""
    strangers = [rank for rank, row in enumerate(rows) if row[0] != MAGIC]
    if strangers:
        return f"{rank_list(strangers)} sent no hook settings: is another collective running on {group}?"
    every = [decode(row) for row in rows]
    parts = []
    for name in FIELDS:
        holders: dict[str, list[int]] = {}
        for rank, settings in enumerate(every):
            holders.setdefault(repr(settings[name]), []).append(rank)
        if len(holders) > 1:
            said = sorted(holders.items(), key=lambda kv: (-len(kv[1]), kv[1]))
            words = [
                f"{rank_list(ranks)} {'have' if len(ranks) > 1 else 'has'} {value}" for value, ranks in said
            ]
            more = f", {len(words) - 4} more" if len(words) > 4 else ""
            parts.append(f"{name}: " + ", ".join(words[:4]) + more)
    return f"{ranks} run the hook with other settings: " + "; ".join(parts) if parts else None


def settings_of(state: Any) -> dict[str, Any]:
    """A state's settings as :func:`encode` takes them: its options of :data:`FIELDS`' names,
    ``record`` and ``metrics`` as whether they are given (each rank names its own file)."""
    settings = {name: getattr(state, name) for name in FIELDS}
    settings["record"], settings["metrics"] = state.record is not None, state.metrics is not None
    return settings


def agree(
    settings: Mapping[str, Any], on: Any, device: torch.device, timeout: float, ranks: str, group: str
) -> None:
    """Raise the same :class:`~stragglar.runtime.MismatchError` on every rank of the process group
    ``on`` unless every rank gives the same ``settings``, gathered with a timeout of ``timeout``
    seconds on ``device``; ``ranks`` and ``group`` name them in the error."""
    # on gloo, a message to and from each peer (channel 0): a silent rank is named by the ranks
    # that waited for it; NCCL gathers in one collective, which cannot tell (the store's roll call does)
    during = f"checking that the {ranks} run the hook with the same settings"
    channel = check_channel(on)
    rows = gather_headers(encode(settings), on, device, dist.get_rank(on), timeout, channel, during)
    reason = disagreement(rows, ranks, group)
    if reason is not None:
        raise MismatchError(reason + _globally(on, group))


def agree_on_bucket(
    bucket: int,
    buffer: torch.Tensor,
    on: Any,
    timeout: float,
    ranks: str = "DDP ranks",
    group: str = "DDP's group",
) -> None:
    """Raise the same :class:`~stragglar.runtime.MismatchError` on every rank of ``on`` unless
    every rank hands the hook bucket number ``bucket`` with as many elements of one dtype.

    Asked before the engine's all_reduce first meets a bucket: the runtime's calls check their
    header themselves, the engine's do not, and gloo aborted the process (``terminate called after
    throwing an instance of 'gloo::EnforceNotMet'``) where one rank's model was float64 and the
    others' float32."""
    row = [BUCKET_MAGIC, bucket, buffer.numel(), dtype_code(buffer)]
    during = f"checking that the {ranks} hand the hook the same buckets"
    rows = gather_headers(row, on, buffer.device, dist.get_rank(on), timeout, check_channel(on), during)
    strangers = [rank for rank, row in enumerate(rows) if row[0] != BUCKET_MAGIC]
    if strangers:
        reason = f"{rank_list(strangers)} sent no bucket: is another collective running on {group}?"
        raise MismatchError(reason + _globally(on, group))
    buckets = holders(range(len(rows)), [tuple(gathered[1:]) for gathered in rows])
    if len(buckets) > 1:
        said = "; ".join(
            f"{rank_list(members)} {'hand' if len(members) > 1 else 'hands'} bucket {index} of "
            f"{count:,} {dtype_name(code)} elements"
            for (index, count, code), members in buckets
        )
        raise MismatchError(
            f"{ranks} reduce other gradients (another model or dtype?): {said}" + _globally(on, group)
        )


def check_channel(on: Any) -> int | None:
    """The channel a check gathers on: on gloo channel 0, a message to and from each peer, so that
    a silent rank is named by the ranks that waited for it; NCCL gathers in one collective, which
    cannot tell (None: the store's roll call names the ranks that had not reached it)."""
    return 0 if dist.get_backend(on) == "gloo" else None


def dtype_code(tensor: torch.Tensor) -> int:
    """A tensor's dtype as a number a header carries: its place in the runtime's DTYPES (-1: another)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return DTYPES.index(dtype) if dtype in DTYPES else -1


def dtype_name(code: int) -> str:
    return DTYPES[code] if code >= 0 else "other"


_V = TypeVar("_V", bound=Hashable)


def holders(ranks: Iterable[int], values: Sequence[_V]) -> list[tuple[_V, list[int]]]:
    """Each value the ranks gave (the i-th of ``values`` is the i-th rank's) with the ranks that
    gave it, in the order of their first ranks."""
    given: dict[_V, list[int]] = {}
    for rank, value in zip(ranks, values, strict=True):
        given.setdefault(value, []).append(rank)
    return sorted(given.items(), key=lambda kv: kv[1])


def _globally(on: Any, group: str, limit: int = 8) -> str:
    """Where ``on``'s ranks are not the world's (HSDP's replicate group, a DDP subgroup), what
    global rank each is: the line numbers them as the group does, the launcher's logs globally."""
    if on is None:
        return ""
    members = dist.get_process_group_ranks(on)
    if members == list(range(len(members))):
        return ""
    pairs = ", ".join(f"rank {index} is global rank {rank}" for index, rank in enumerate(members[:limit]))
    return f" ({group}'s ranks: {pairs}{', ...' if len(members) > limit else ''})"
