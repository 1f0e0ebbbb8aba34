"""Emulated per-rank links (``--link-rate``): sockets paced, and gloo's ranks really limited by it."""

from __future__ import annotations

import contextlib
import socket
import struct
import sys
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from stragglar.cli import cli
from stragglar.errors import ArgumentError, InputError
from stragglar.measure.links import (
    MAX_LINK_RATE,
    MIN_LINK_RATE,
    SO_MAX_PACING_RATE,
    check_link_rate,
    pace_sockets,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_MAX_PACING_RATE is Linux's")

MiB = 2**20


@contextlib.contextmanager
def tcp_pair() -> Iterator[tuple[socket.socket, socket.socket, socket.socket]]:
    """A listener on 127.0.0.1 and a connection through it: (listener, client, accepted)."""
    with (
        socket.create_server(("127.0.0.1", 0)) as listener,
        socket.create_connection(listener.getsockname()[:2], timeout=5) as client,
    ):
        accepted, _ = listener.accept()
        with accepted:
            accepted.settimeout(5)
            yield listener, client, accepted


def rate_of(sock: socket.socket) -> int:
    value: int = struct.unpack("I", sock.getsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, 4))[0]
    return value


def test_pace_sockets_paces_connected_tcp_sockets_and_leaves_the_rest() -> None:
    rate = 3 * MiB
    a, b = socket.socketpair()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with tcp_pair() as (listener, client, accepted), a, b, udp:
        before = rate_of(listener)
        paced = pace_sockets(rate)
        assert paced >= 2  # ours; pytest's own connections, if any, are paced too
        assert rate_of(client) == rate_of(accepted) == rate
        assert rate_of(listener) == before != rate  # a listener sends nothing
        assert rate_of(udp) != rate
        client.sendall(b"still open")  # the descriptors were borrowed, not closed
        assert accepted.recv(64) == b"still open"
        a.sendall(b"x")
        assert b.recv(1) == b"x"


def test_a_paced_socket_sends_no_faster_than_its_rate() -> None:
    """A lower bound only: a loaded machine can make the transfer slower, never faster."""
    rate, size = MIN_LINK_RATE, MiB
    with tcp_pair() as (_, client, accepted):
        pace_sockets(rate)
        received = 0
        start = time.perf_counter()
        client.setblocking(False)
        data = memoryview(bytes(size))
        sent = 0
        while received < size:
            with contextlib.suppress(BlockingIOError):
                sent += client.send(data[sent:]) if sent < size else 0
            with contextlib.suppress(TimeoutError):
                accepted.settimeout(0.01)
                received += len(accepted.recv(1 << 16))
        elapsed = time.perf_counter() - start
    assert elapsed >= 0.5 * size / rate, elapsed  # TCP lets a first burst out; unpaced 1 MiB takes ~1 ms


@pytest.mark.parametrize("rate", [MIN_LINK_RATE - 1, 0.0, -1.0, MAX_LINK_RATE + 1, float("nan")])
def test_link_rates_out_of_range_are_refused(rate: float) -> None:
    with pytest.raises(InputError, match="link rate must be"):
        check_link_rate(rate)


def test_gloo_ranks_are_held_to_the_link_rate() -> None:
    pytest.importorskip("torch")
    from stragglar.measure.run import run_benchmark

    n, size, rate = 3, 4 * MiB, 16 * MiB
    result = run_benchmark("torch", n, size, delay=0.0, iters=1, warmup=0, timeout=60, link_rate=rate)
    assert result.link_rate == rate
    assert "links paced to 16 MiB/s" in result.report()
    # gloo's ring sends 2 (N-1)/N of the buffer from every rank; StragglAR's busiest rank more
    assert result.baseline_time >= 0.9 * 2 * (n - 1) / n * size / rate
    assert result.time >= 0.9 * size / rate


@pytest.mark.parametrize("rate", ["200MB/s", True, None, [1e8]])
def test_a_link_rate_that_is_not_a_number_is_an_argument_error(rate: object) -> None:
    with pytest.raises(ArgumentError, match="link_rate must be bytes per second"):
        check_link_rate(rate)  # type: ignore[arg-type]


def test_link_rate_needs_the_torch_backend() -> None:
    from stragglar.measure.run import run_benchmark

    with pytest.raises(InputError, match="torch backend only"):
        run_benchmark("local", 3, MiB, link_rate=16 * MiB)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--backend", "local", "--gpus", "4", "--link-rate", "1GB/s"], "--link-rate does not apply"),
        (["bench", "--backend", "local", "--link-rate", "1GB/s"], "--link-rate does not apply"),
        (["run", "--backend", "torch", "--gpus", "4", "--link-rate", "10kB/s"], "link rate must be"),
        (["run", "--backend", "torch", "--gpus", "4", "--link-rate", "fast"], "--link-rate"),
    ],
)
def test_cli_link_rate_errors_are_one_line_exit_2(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert message in lines[-1]
    assert "Traceback" not in result.output
