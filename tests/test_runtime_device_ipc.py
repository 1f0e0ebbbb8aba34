"""CUDA IPC in this process (stragglar/runtime/device/ipc.py): a handle opened once however many
registrations use it and closed with its last user, handles through a gather of integers and
back, and the driver's absence said in one line."""

from __future__ import annotations

import ctypes
import types

import pytest

from stragglar.errors import InputError
from stragglar.runtime.device import ipc


def test_a_handle_is_opened_once_and_closed_with_its_last_user() -> None:
    calls: list[tuple[str, object]] = []

    def open_handle(handle: bytes) -> int:
        calls.append(("open", handle))
        return 4096 * len(calls)  # a new address each time

    runtime = types.SimpleNamespace(
        ipcOpenMemHandle=open_handle, ipcCloseMemHandle=lambda address: calls.append(("close", address))
    )
    openings = ipc.Openings()
    first, second = b"a" * 64, b"b" * 64
    address = openings.open(runtime, first)
    assert openings.open(runtime, first) == address  # two shared buffers in one peer allocation
    other = openings.open(runtime, second)
    assert other != address and [c for c in calls if c[0] == "open"] == [("open", first), ("open", second)]
    openings.close(runtime, first)
    assert ("close", address) not in calls  # one user left
    openings.close(runtime, first)
    openings.close(runtime, second)
    assert [c for c in calls if c[0] == "close"] == [("close", address), ("close", other)]
    assert not openings.opened
    assert openings.open(runtime, first) != address  # opened anew once closed
    assert calls[-1] == ("open", first)


def test_a_handle_travels_as_integers_and_back() -> None:
    handle = bytes(range(64))
    words = ipc.handle_words(handle)
    assert len(words) == ipc.HANDLE_BYTES // 8 and all(isinstance(w, int) for w in words)
    assert ipc.handle_bytes(words) == handle


def test_without_the_cuda_driver_an_allocation_cannot_be_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    ipc._driver.cache_clear()
    monkeypatch.setattr(ctypes, "CDLL", missing)
    try:
        with pytest.raises(InputError, match=r"^cannot load the CUDA driver \(libcuda\.so\.1\)"):
            ipc.allocation_base(0x7F0000000000)
    finally:
        ipc._driver.cache_clear()
