"""A pytest plugin that runs the device engine's GPU tests on the device stand-in.

``tests/test_runtime_device_gpu.py`` is the check to run on a machine with a GPU.  Loaded with
``-p gpu_stand_in`` (``tests/`` on the path), this plugin puts the stand-in of
:mod:`fake_device` in ``sys.modules["cupy"]`` before that module is collected, as a CuPy with one
GPU whose kernels are the CUDA source compiled for the host, watched against the real CuPy where
one is installed (:mod:`cupy_surface`).  So the GPU tests' own code (their calls, their
arguments, their checks) runs on every CI run, not first on a GPU.  The session fails if the
watcher saw a breach anywhere, in whichever thread."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_device import H200, FakeCuda, host_library, installed

_session: list[tuple[pytest.MonkeyPatch, Iterator[FakeCuda], tempfile.TemporaryDirectory[str]]] = []


def pytest_configure(config: pytest.Config) -> None:
    folder = tempfile.TemporaryDirectory(prefix="stragglar-gpu-stand-in-")
    library = host_library(Path(folder.name))
    patch = pytest.MonkeyPatch()
    stand_in = installed(patch, library, cuda=FakeCuda(dict(H200)))
    next(stand_in)
    _session.append((patch, stand_in, folder))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not _session:
        return
    patch, stand_in, folder = _session.pop()
    try:
        next(stand_in, None)  # the stand-in's teardown: fails if the watcher saw a breach
    except pytest.fail.Exception as breach:
        print(f"\n{breach}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    finally:
        patch.undo()
        folder.cleanup()
