"""The device engine's GPU tests (test_runtime_device_gpu.py), run on the device stand-in: with
the plugin :mod:`gpu_stand_in` they find a CuPy with one GPU whose kernels are the CUDA source
compiled for the host, so their own code runs here and a mistake in it shows now, not in the
first minutes a GPU is lent.  Every test runs but those that need torch with CUDA."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


def test_the_device_engine_s_gpu_tests_pass_on_the_stand_in() -> None:
    if shutil.which("g++") is None:
        pytest.skip("needs g++ to compile the CUDA source for the host")
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "gpu_stand_in"]
    done = subprocess.run(
        [*command, str(TESTS / "test_runtime_device_gpu.py")],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": path},
        cwd=TESTS.parent,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\d+ passed", done.stdout), done.stdout[-2000:]
    reasons = set(re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", done.stdout, flags=re.M))
    # each test passed or was skipped for want of torch with CUDA (a module skipped for want of a
    # GPU, say, would be named here)
    assert reasons <= {"torch has no CUDA", "could not import 'torch': No module named 'torch'"}, reasons
