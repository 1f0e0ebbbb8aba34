"""The ``stragglar`` command run in-process, and the contract every failure of it keeps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from stragglar.cli import cli

SUMMARY_8 = (
    "stragglar: 8 GPUs (straggler 7), 7 chunks, 9 rounds after the straggler arrives "
    "(lower bound R*(8) = 9: optimal), 15 in all, 98 transfers; proved"
)  # what `stragglar synth --gpus 8` ends with


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def one_error(result: Result, code: int) -> str:
    """The failure contract: exit ``code``, one ``Error:`` line on stderr, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert "Traceback" not in result.output
    return lines[0]


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` in bash, ``stragglar`` being this interpreter's (descriptors the shell opens)."""
    stragglar = f"{sys.executable} -m stragglar"
    return subprocess.run(
        ["bash", "-c", command.replace("stragglar", stragglar)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
