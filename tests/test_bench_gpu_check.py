"""benchmarks/gpu_check.sh on a machine where torch sees no CUDA GPU: refused in one line, exit 2,
before any step.  bench_gpu.py says "no GPU" and exits 0 there, so every step "passed" and the
check exited 0, having checked nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from stragglar.measure.gpus import gpu_count

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.sh"


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
@pytest.mark.skipif(gpu_count() > 0, reason="a CUDA GPU is visible here")
def test_without_a_gpu_it_refuses_before_any_step(tmp_path: Path) -> None:
    out = tmp_path / "check"
    bin_dir = str(Path(sys.executable).parent)  # its python3 is this interpreter, with stragglar
    env = {**os.environ, "GPU_CHECK_DIR": str(out), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(SCRIPT), "profile"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 2 and done.stdout == "", done.stdout  # no step's "=====" line
    said = done.stderr.splitlines()  # "torch sees no CUDA device", or "no torch" where it has none
    assert len(said) == 1 and said[0].startswith("gpu_check.sh: no GPU: "), done.stderr
    assert said[0].endswith(": run it where torch sees a CUDA GPU")
    assert not out.exists()  # nothing written: no device.txt, no log
