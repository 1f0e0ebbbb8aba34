"""Emulated per-rank links: every TCP socket of a rank paced to one rate.

The alpha-beta model prices a round by the busiest rank's bytes, as if every rank had a link of
its own (a GPU's NVLink ports, a node's NIC).  Ranks on one host share its loopback instead: a
copy through the kernel, as fast as the cores allow, so the *total* bytes of a round cost, not
the busiest rank's, and a schedule that moves fewer bytes through its busiest rank (more chunks)
gains nothing.  Pacing every socket to ``rate`` bytes per second gives each rank the link the
model assumes: in a schedule's round a rank sends to one peer, so its one busy socket is its
link; with the rate well under what the cores can copy, the host stops being the bottleneck.

The pacing is Linux's own (``SO_MAX_PACING_RATE``, which TCP honours by itself since 4.13, no
``fq`` qdisc or privileges needed); it limits what a socket *sends*, so a rank receiving from
several peers at once is not limited, which no schedule here asks of it.
"""

from __future__ import annotations

import numbers
import os
import socket
import struct
import sys

from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime import RankError
from stragglar.units import count_of, format_bytes

__all__ = [
    "MAX_LINK_RATE",
    "MIN_LINK_RATE",
    "SO_MAX_PACING_RATE",
    "check_link_rate",
    "pace_links",
    "pace_sockets",
    "paced_to",
]

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)  # Linux's value; Python names it from 3.12
MIN_LINK_RATE = float(2**20)  # bytes/s: slower links would make a 64 MiB benchmark take minutes per round
MAX_LINK_RATE = float(2**32 - 1)  # the socket option's 32-bit form, which every kernel accepts


def check_link_rate(rate: float) -> float:
    """``rate`` (bytes per second) as a float if it can be a link's: an ArgumentError for a value
    that is not a number, an InputError saying the range for one outside it."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real):
        raise ArgumentError(
            f"link_rate must be bytes per second, got {described(rate)} ({type(rate).__name__})"
        )
    rate = float(rate)
    if not sys.platform.startswith("linux"):
        raise InputError("emulated links need Linux (SO_MAX_PACING_RATE)")
    if not MIN_LINK_RATE <= rate <= MAX_LINK_RATE:
        raise InputError(
            f"a link rate must be {format_bytes(MIN_LINK_RATE)}/s to {format_bytes(MAX_LINK_RATE)}/s, "
            f"got {format_bytes(rate)}/s"
        )
    return rate


def paced_to(rate: float) -> str:
    """``links paced to 190.7 MiB/s``: how reports name the rate."""
    return f"links paced to {format_bytes(rate)}/s"


def pace_sockets(rate: float) -> int:
    """Pace every connected TCP socket of this process to ``rate`` bytes per second; return how
    many (listening sockets send nothing and are left alone).

    Call it once the process group has connected its peers (gloo connects the full mesh when the
    group is made).  A kernel without the option fails here (OSError), and each rate is read
    back.  What no check here can see: a kernel before 4.13 keeps the rate but paces only under
    the ``fq`` qdisc; a benchmark's fitted bandwidth far above the rate gives that away.
    """
    value = int(check_link_rate(rate))
    paced = 0
    for fd in _socket_fds():
        try:
            sock = socket.socket(fileno=fd)  # borrows the descriptor; detach() below gives it back
        except OSError:  # closed since it was listed
            continue
        try:
            if not _connected_tcp(sock):
                continue
            sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, value)
            (got,) = struct.unpack("I", sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 4))
            if got != value:
                raise OSError(f"the kernel kept a pacing rate of {got} bytes/s, not {value}")
            paced += 1
        finally:
            sock.detach()
    return paced


def pace_links(rank: int, num_ranks: int, rate: float) -> None:
    """Pace this rank's links (:func:`pace_sockets`); fail if fewer sockets are connected than it
    has peers (with ``TORCH_GLOO_LAZY_INIT`` gloo connects at first use, and those sockets would
    run unpaced: a measurement on unpaced links reported as paced)."""
    paced = pace_sockets(rate)
    if paced < num_ranks - 1:
        raise RankError(
            f"rank {rank} found {count_of(paced, 'connected TCP socket')} to pace, fewer than its "
            f"{num_ranks - 1} peers: "
            "gloo connects lazily here (unset TORCH_GLOO_LAZY_INIT)",
            rank=rank,
            reason="failed",
            during="pacing its links",
        )


def _connected_tcp(sock: socket.socket) -> bool:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return False
    if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        return False
    try:
        sock.getpeername()
    except OSError:  # not connected (yet, or any more)
        return False
    return True


def _socket_fds() -> list[int]:
    """This process's open socket descriptors (Linux's /proc lists each as ``socket:[inode]``)."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.append(int(name))
        except OSError:  # closed since the listing (the listing's own descriptor, for one)
            continue
    return found
