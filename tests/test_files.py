"""Atomic writes: a failed write leaves the old file and nothing partial; a link keeps being a link;
one of our own descriptors (``-o /dev/stdout >> log``) is written as it is, never replaced."""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

import stragglar
from stragglar import files
from stragglar.cli import cli
from stragglar.errors import InputError
from stragglar.files import ABANDONED_AFTER, own_descriptor, working_folder, write_text


def test_write_text_replaces_the_file_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keep.json"
    write_text(path, "good\n")
    path.chmod(0o640)
    write_text(path, "better\n")
    assert path.read_text() == "better\n" and path.stat().st_mode & 0o777 == 0o640

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text(path, "lost\n")
    with pytest.raises(OSError, match="No space left"):
        write_text(tmp_path / "new.xml", "lost\n")
    assert path.read_text() == "better\n"  # the old file is untouched ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]  # ... and nothing partial is left


def test_write_text_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    target, link = tmp_path / "v3.json", tmp_path / "latest.json"
    target.write_text("old\n")
    link.symlink_to(target.name)
    write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == target.name  # the link is still a link ...
    assert target.read_text() == "new\n"  # ... and its target has the new text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "v3.json"]
    dangling = tmp_path / "gone.json"
    dangling.symlink_to(tmp_path / "missing" / "x.json")
    with pytest.raises(InputError, match="symbolic link to a missing file"):
        write_text(dangling, "lost\n")
    assert dangling.is_symlink() and not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("args", "suffix"),
    [
        (["synth", "--gpus", "4", "-o", "{out}"], ".json"),
        (["cost", "--gpus", "4", "--plot", "{out}"], ".png"),
        (["export", "{schedule}", "-o", "{out}"], ".xml"),
        (["show", "{schedule}", "--plot", "{out}"], ".png"),
    ],
)
def test_an_output_through_a_loop_of_links_is_one_line(tmp_path: Path, args: list[str], suffix: str) -> None:
    """A folder that is a loop of links, or a file that is one, ended in a traceback (RuntimeError
    from pathlib's resolve, or an OSError from the check that the output is not the input)."""
    schedule = tmp_path / "s.json"
    assert CliRunner().invoke(cli, ["synth", "--gpus", "4", "-o", str(schedule)]).exit_code == 0
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / f"a{suffix}").symlink_to(f"b{suffix}")
    (tmp_path / f"b{suffix}").symlink_to(f"a{suffix}")
    for out, words in (
        (tmp_path / "loop" / f"x{suffix}", "its folder is a loop of symbolic links"),
        (tmp_path / f"a{suffix}", f"a{suffix} is a loop of symbolic links: write to a file"),
    ):
        result = CliRunner().invoke(cli, [a.format(out=out, schedule=schedule) for a in args])
        assert result.exit_code == 2, result.output
        assert words in result.output and "Traceback" not in result.output, result.output


def test_a_folder_given_as_the_file_to_write_is_refused_as_a_folder(tmp_path: Path) -> None:
    """It was called "not a regular file (a device, fifo or socket)"."""
    (tmp_path / "through").symlink_to(tmp_path)
    for folder in (tmp_path, tmp_path / "through"):
        with pytest.raises(InputError, match=f"^{folder} is a folder: name a file in it$"):
            write_text(folder, "lost\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["through"]


def test_own_descriptors_are_told_from_files_and_from_other_processes(tmp_path: Path) -> None:
    (tmp_path / "out.json").symlink_to("/dev/stdout")
    (tmp_path / "again.json").symlink_to(tmp_path / "out.json")
    names = {
        "/dev/stdout": 1,
        "/dev/stderr": 2,
        "/dev/fd/2": 2,
        "/proc/self/fd/1": 1,
        f"/proc/{os.getpid()}/fd/2": 2,
        "/proc/thread-self/fd/1": 1,
        str(tmp_path / "again.json"): 1,
        str(tmp_path / "plain.json"): None,
        "/dev/null": None,
    }
    assert {name: own_descriptor(name) for name in names} == names
    with pytest.raises(InputError, match="a descriptor of another process"):
        own_descriptor(f"/proc/{os.getppid()}/fd/1")


def test_a_descriptor_is_a_plain_number_a_c_int_can_hold() -> None:
    """Digits of other scripts were a traceback (a superscript two) or another descriptor (an
    Arabic-Indic one was 1); a number past a C int's was an OverflowError, one past 4,300 digits a
    ValueError."""
    assert own_descriptor("/dev/fd/\u00b2") is None and own_descriptor("/dev/fd/\u0661") is None
    for digits in ("9999999999", "9" * 30, "9" * 5000):
        with pytest.raises(InputError, match="no such descriptor"):
            own_descriptor(f"/dev/fd/{digits}")


def test_a_descriptor_is_written_as_it_is_not_reopened_or_replaced(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    log.write_text("earlier\n")
    with open(log, "a") as appending:  # what `>> build.log` opens
        write_text(f"/proc/self/fd/{appending.fileno()}", "new\n")
        write_text(f"/dev/fd/{appending.fileno()}", "newer\n")
    assert log.read_text() == "earlier\nnew\nnewer\n" and sorted(os.listdir(tmp_path)) == ["build.log"]


STRAGGLAR = f"{shlex.quote(sys.executable)} -m stragglar"
SYNTH = f"{STRAGGLAR} synth --gpus 4 --format json"
BENCH = f"{STRAGGLAR} bench --backend local -n 2 --sizes 1KB --delays 0 --iters 1"


@pytest.mark.parametrize(
    "shell",
    [
        f"{SYNTH} -o /dev/stdout >> out",
        f"{SYNTH} -o /dev/stderr 2>> out",
        f"{SYNTH} -o /proc/self/fd/1 >> out",
        f"{SYNTH} -o /dev/fd/1 >> out",
        f"{SYNTH} -o /dev/fd/3 3>> out",
        f"{SYNTH} -o - >> out",
        f"ln -s /dev/stdout link.json && {STRAGGLAR} synth --gpus 4 -o link.json >> out",
        f"{BENCH} --json /dev/stdout >> out",
        f"{{ echo HEADER; {SYNTH} -o /dev/stdout; echo FOOTER; }} >> out",
    ],
)
def test_an_output_that_is_a_shell_redirection_keeps_what_the_file_had(tmp_path: Path, shell: str) -> None:
    """``-o /dev/stdout >> build.log`` appends: the rename onto the link's target replaced the file."""
    (tmp_path / "out").write_text("earlier\n")
    env = {**os.environ, "PYTHONPATH": str(Path(stragglar.__file__).parents[1])}
    done = subprocess.run(
        ["sh", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = (tmp_path / "out").read_text().splitlines()
    framed = "HEADER" in shell
    assert (
        lines[0] == "earlier" and (lines[1:2] == ["HEADER"]) == framed and (lines[-1] == "FOOTER") == framed
    )
    document = json.loads("\n".join(lines[1 + framed : len(lines) - framed]))
    assert document.get("format") == "stragglar-schedule" or document.get("backend") == "local"


def test_another_process_s_descriptor_is_refused_and_its_file_kept(tmp_path: Path) -> None:
    log = tmp_path / "theirs.log"
    log.write_text("theirs\n")
    with open(log, "a") as theirs:
        other = subprocess.Popen(["sleep", "60"], stdout=theirs)
    try:
        result = CliRunner().invoke(
            cli, ["synth", "--gpus", "4", "-o", f"/proc/{other.pid}/fd/1", "--format", "json"]
        )
    finally:
        other.kill()
        other.wait()
    assert result.exit_code == 2 and "a descriptor of another process" in result.output
    assert log.read_text() == "theirs\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["synth", "--gpus", "4", "-o", ""], "an empty file name: name a file, or - for standard output"),
        (["cost", "--gpus", "4", "--plot", "-"], "- is standard output, which carries the command's text"),
    ],
)
def test_an_empty_output_name_and_a_chart_on_stdout_are_refused(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in result.stderr and result.stdout == ""


def test_dash_is_standard_output_with_the_summary_on_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["synth", "--gpus", "4", "-o", "-", "--format", "json"])
    assert result.exit_code == 0 and json.loads(result.stdout)["num_ranks"] == 4
    assert result.stderr.startswith("stragglar: 4 GPUs") and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("closed", "code", "where"),
    [(">&-", 2, "stderr"), ("2>&-", 0, "stdout"), (">&- 2>&-", 2, "")],
)
def test_a_command_started_with_a_stream_closed_never_tracebacks(
    tmp_path: Path, closed: str, code: int, where: str
) -> None:
    """Python starts a process whose descriptor 1 or 2 is closed with ``sys.stdout`` or
    ``sys.stderr`` None: the output that cannot go out is one error line (exit 2), the other
    stream's text still goes out, and nothing is a traceback."""
    env = {**os.environ, "PYTHONPATH": str(Path(stragglar.__file__).parents[1])}
    shell = f"{STRAGGLAR} synth --gpus 4 {closed}"
    done = subprocess.run(
        ["sh", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == code and "Traceback" not in done.stdout + done.stderr, done.stderr
    if where == "stderr":
        assert done.stderr == "Error: cannot write the output: standard output is closed\n"
    if where == "stdout":
        assert done.stdout.splitlines()[-1].startswith("stragglar: 4 GPUs (straggler 3)")


def test_a_write_that_fails_names_the_file_asked_for_not_its_temporary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A missing folder gave ``FileNotFoundError: '.../nodir/.x.json.itnoavnk.tmp'``, a name the
    caller never gave; a full disk named the temporary too."""
    missing = tmp_path / "nodir" / "x.json"
    with pytest.raises(FileNotFoundError) as info:
        write_text(missing, "{}")
    assert info.value.filename == str(missing) and ".tmp" not in str(info.value)
    old = tmp_path / "old.json"
    old.write_text("old")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError) as full_disk:
        write_text(old, "new")
    assert full_disk.value.errno == errno.ENOSPC and full_disk.value.filename == str(old)
    assert old.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["old.json"]


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to act as another user"
)
def test_another_user_s_read_only_file_is_not_replaced() -> None:
    """The rename needs only the folder's permission: in a folder anyone may write, a user's
    ``-o`` replaced root's read-only file (and took it over), where the shell's ``>`` refuses.
    (The folder is made in the system's temporary folder: the other user must reach it.)"""
    folder = Path(tempfile.mkdtemp(prefix="stragglar-shared-"))
    try:
        folder.chmod(0o777)
        kept = folder / "kept.json"
        kept.write_text("{}\n")
        kept.chmod(0o444)
        code = "from stragglar.files import write_text; write_text('kept.json', 'new')"
        nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        env = {**os.environ, "PYTHONPATH": str(Path(stragglar.__file__).parents[1])}
        try:
            done = subprocess.run(
                [*nobody, sys.executable, "-c", code],
                cwd=folder,
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
            )
        except FileNotFoundError:
            pytest.skip("no setpriv")
        assert (
            done.returncode != 0
            and "PermissionError: [Errno 13] Permission denied: 'kept.json'" in done.stderr
        )
        assert kept.read_text() == "{}\n" and kept.stat().st_uid == 0
        assert sorted(p.name for p in folder.iterdir()) == ["kept.json"]  # no temporary left
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_killed_writer_s_temporary_is_removed_by_the_next_write(tmp_path: Path) -> None:
    """SIGKILL while a file was written left ``.out.json.XXXX.tmp`` for good.  The next write of
    that file removes a temporary older than a minute whose lock nobody holds, and nothing else:
    not a fresh one (its writer may be about to lock it), not a locked one (its writer lives),
    not another file's, not a file of the user's."""
    out = tmp_path / "out.json"
    old = time.time() - 2 * ABANDONED_AFTER
    names = {
        "abandoned": ".out.json.stragglar-k1ll3d.tmp",
        "fresh": ".out.json.stragglar-n3w.tmp",
        "locked": ".out.json.stragglar-l1v3.tmp",
        "other": ".in.json.stragglar-k1ll3d.tmp",
        "users": ".out.json.backup.tmp",
    }
    for key, name in names.items():
        (tmp_path / name).write_text(key)
        if key != "fresh":
            os.utime(tmp_path / name, (old, old))
    held = os.open(tmp_path / names["locked"], os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        write_text(out, "new")
    finally:
        os.close(held)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([*(n for k, n in names.items() if k != "abandoned"), "out.json"])
    assert out.read_text() == "new"


def test_a_killed_launcher_s_folder_is_removed_by_the_next_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old = time.time() - 2 * ABANDONED_AFTER
    abandoned = tmp_path / "stragglar-k1ll3d"
    abandoned.mkdir()
    (abandoned / ".lock").touch()
    os.utime(abandoned / ".lock", (old, old))
    unlocked_by_design = tmp_path / "stragglar-0ld"  # an older version's: no lock, never swept
    unlocked_by_design.mkdir()
    with working_folder("stragglar-") as first:
        os.utime(Path(first) / ".lock", (old, old))  # old, but its lock is held: alive
        with working_folder("stragglar-") as second:
            assert sorted(tmp_path.iterdir()) == sorted([Path(first), Path(second), unlocked_by_design])
    assert sorted(tmp_path.iterdir()) == [unlocked_by_design]


STOPPED_WRITER = """
import os, signal, sys
from stragglar import files

real_fsync = os.fsync
def fsync(fd):  # the stop arrives in the middle of the write
    os.kill(os.getpid(), getattr(signal, sys.argv[2]))
    real_fsync(fd)
os.fsync = fsync
if sys.argv[3] == "raises":  # a handler of the program's own, as the launcher's: it still runs
    def stop(signum, frame):
        raise SystemExit(f"stopped by {signal.Signals(signum).name}")
    signal.signal(getattr(signal, sys.argv[2]), stop)
elif sys.argv[3] == "ignored":  # nohup
    signal.signal(getattr(signal, sys.argv[2]), signal.SIG_IGN)
with files.stops_wait_for_writes():  # as the stragglar command runs
    files.write_text(sys.argv[1], "new")
print("went on")
"""


@pytest.mark.parametrize(
    ("stop", "handler", "code", "said"),
    [
        ("SIGTERM", "default", -15, ""),
        ("SIGHUP", "default", -1, ""),
        ("SIGTERM", "raises", 1, "stopped by SIGTERM\n"),
        ("SIGHUP", "ignored", 0, "went on\n"),
    ],
)
def test_a_writer_stopped_mid_write_finishes_it_and_leaves_no_temporary(
    tmp_path: Path, stop: str, handler: str, code: int, said: str
) -> None:
    """SIGTERM or SIGHUP in the middle of a write ended the process at once and left
    ``.out.json.stragglar-XXXX.tmp`` beside the output (until the next write of that file swept
    it): the write now finishes first, then the signal takes its course as it would have."""
    out = tmp_path / "out.json"
    out.write_text("old")
    script = tmp_path / "writer.py"
    script.write_text(STOPPED_WRITER)
    done = subprocess.run(
        [sys.executable, str(script), str(out), stop, handler], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code, done.stderr
    assert done.stdout + done.stderr == said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json", "writer.py"]
    assert out.read_text() == "new"


def test_the_command_s_writes_wait_for_a_stop(tmp_path: Path) -> None:
    """The ``stragglar`` command asks it: ``synth -o`` stopped by SIGTERM in the middle of its
    write ends with 143 and the whole file, no temporary."""
    out = tmp_path / "s.json"
    code = (
        "import os, signal, sys\n"
        "real = os.fsync\n"
        "os.fsync = lambda fd: (os.kill(os.getpid(), signal.SIGTERM), real(fd))\n"
        "from stragglar.__main__ import main\n"
        "main()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, "synth", "--gpus", "4", "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == -15, done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    assert json.loads(out.read_text())["num_ranks"] == 4


LIBRARY_WRITER = """
import faulthandler, os, signal, sys
from stragglar import files

faulthandler.register(signal.SIGTERM)  # a handler installed from C: Python's table says SIG_DFL
files.write_text(sys.argv[1], "new")
os.kill(os.getpid(), signal.SIGTERM)
print("still here")
"""


def test_a_program_s_own_writes_leave_its_signal_handlers_alone(tmp_path: Path) -> None:
    """Outside the command, a write sets no handler: holding SIGTERM for every write dropped a
    handler installed from C since Python started (faulthandler's here), and the program died."""
    script = tmp_path / "writer.py"
    script.write_text(LIBRARY_WRITER)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out.txt")], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout) == (0, "still here\n"), done.stderr
    assert "Current thread" in done.stderr  # faulthandler answered the signal


PENDING_CTRL_C = """
import signal
from stragglar import files

real = signal.signal
def signal_signal(signum, handler):  # CPython runs a pending SIGINT's handler before it sets one
    if signum == signal.SIGHUP and handler not in (signal.SIG_DFL, signal.SIG_IGN):
        signal.signal = real
        raise KeyboardInterrupt
    return real(signum, handler)
signal.signal = signal_signal
before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)
try:
    with files.stops_wait_for_writes():
        files.write_text("out.txt", "new")
except KeyboardInterrupt:
    print("interrupted")
print((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGHUP)) == before)
"""


def test_a_ctrl_c_pending_as_the_stops_are_held_leaves_no_handler_of_ours(tmp_path: Path) -> None:
    """signal.signal runs a pending SIGINT's handler before it sets the new one: the held SIGTERM's
    handler, set just before, was never put back, and every later SIGTERM went unanswered."""
    script = tmp_path / "pending.py"
    script.write_text(PENDING_CTRL_C)
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert (done.returncode, done.stdout) == (0, "interrupted\nTrue\n"), done.stderr


def test_a_file_is_read_without_reserving_the_limit(tmp_path: Path) -> None:
    """A read of the limit allocated 1 GiB for a file of a few bytes, which a host that does not
    overcommit memory may refuse (a MemoryError for a 1 kB schedule)."""
    path = tmp_path / "s.json"
    path.write_text("x" * 1000, encoding="utf-8")
    tracemalloc.start()
    try:
        assert files.read_text(path) == "x" * 1000
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, peak


class Growing(io.BytesIO):
    """A file whose size, as ``fstat`` of its descriptor says it, is another file's: what a file
    that grows after it was opened looks like to its reader, without patching ``os`` for everyone
    (a patched ``os.fstat`` broke pytest's own descriptors)."""

    def __init__(self, data: bytes, sized: Path) -> None:
        super().__init__(data)
        self.sized = sized.open("rb")

    def fileno(self) -> int:
        return self.sized.fileno()

    def close(self) -> None:
        self.sized.close()
        super().close()


def test_a_file_that_grows_as_it_is_read_is_read_whole_up_to_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, opened = tmp_path / "s.json", tmp_path / "as-opened"
    path.write_text("y" * 300, encoding="utf-8")
    opened.write_bytes(b"y" * 100)  # 100 bytes when it was opened, 300 as it is read
    monkeypatch.setattr(files, "open_regular", lambda p, kind, limit: Growing(b"y" * 300, opened))
    assert files.read_text(path) == "y" * 300
    monkeypatch.setattr(files, "MAX_READ_BYTES", 200)
    with pytest.raises(InputError, match="grew past 200 bytes while being read"):
        files.read_text(path)
