"""Reading and writing files so that nothing hangs and nothing is lost.

Reading takes regular files only, of a bounded size, checked before anything is read: a FIFO
would block forever and ``/dev/zero`` never ends.  Writing goes to a temporary file in the same
folder, then a rename: a write that fails half way (a full disk, a signal) leaves the old file
as it was and no partial file behind, because the new content only replaces the old by
``os.replace``, which is atomic on one file system.  An output that is a symbolic link is written
through: its target is replaced, the link kept (a rename onto the link itself would put a plain
file where a user's ``latest.json -> v3.json`` was).

An output that names one of this process's own open descriptors (``/dev/stdout``, ``/dev/stderr``,
``/dev/fd/N``, ``/proc/self/fd/N``, or a link to one of them) is written to that descriptor, as
it is: ``synth -o /dev/stdout >> build.log`` appends to ``build.log``.  Followed to its end, the
link names the file the shell opened, which a rename would replace (earlier lines gone), and
which opening again would truncate (``>>`` lost).  Another process's descriptor is refused.

>>> import tempfile, pathlib
>>> folder = pathlib.Path(tempfile.mkdtemp())
>>> write_text(folder / "a.txt", "one\\n")
>>> (folder / "a.txt").read_text(), sorted(p.name for p in folder.iterdir())
('one\\n', ['a.txt'])
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import json
import os
import re
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

from stragglar.errors import InputError, shown

try:  # POSIX: the locks that tell an abandoned temporary; elsewhere none is swept
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "MAX_READ_BYTES",
    "check_appendable",
    "check_replaceable",
    "is_link_loop",
    "json_complaint",
    "lone_surrogate",
    "open_appending",
    "open_regular",
    "own_descriptor",
    "read_text",
    "refuse_standard_input",
    "same_file",
    "stops_wait_for_writes",
    "working_folder",
    "write_bytes",
    "write_text",
]

MAX_READ_BYTES = 2**30  # the largest schedule stragglar handles is about 400 MB of JSON
_MAX_LINKS = 40  # links followed before giving up, as the kernel does
_ASCII_NUMBER = re.compile(r"[0-9]+")
_MAX_DESCRIPTOR = 2**31 - 1  # a C int's largest
_HOLD_STOPS = contextvars.ContextVar("stragglar_hold_stops", default=False)
_STOPS = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))
_DESCRIPTORS = re.compile(r"/proc/([0-9]+)(?:/task/[0-9]+)?/fd")  # /proc/self/fd and /dev/fd resolve to it


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of the regular file ``path``; an :class:`InputError` naming the file otherwise."""
    name = shown(os.fspath(path))
    with open_regular(path, "schedules", MAX_READ_BYTES) as file:
        try:
            # As many bytes as the file has, and one to see it grow: a read of the limit allocated
            # 1 GiB for any file, which a host that does not overcommit memory may refuse.
            size = os.fstat(file.fileno()).st_size
            data = file.read(min(size, MAX_READ_BYTES) + 1)
            if len(data) > size:  # it grew while being read: the rest, up to the limit
                data += file.read(MAX_READ_BYTES + 1 - len(data))
        except OSError as e:
            raise InputError(f"cannot read {name}: {e.strerror or e}") from None
    if len(data) > MAX_READ_BYTES:
        raise InputError(f"{name} grew past {MAX_READ_BYTES:,} bytes while being read")
    try:
        return data.decode("utf-8-sig")  # a byte order mark some editors write is no part of the text
    except UnicodeDecodeError as e:
        raise InputError(f"{name}: not UTF-8 text: byte {e.start}") from None


def open_regular(path: str | os.PathLike[str], kind: str, limit: int | None = None) -> BinaryIO:
    """The regular file ``path`` open for reading (binary), if it has at most ``limit`` bytes; an
    :class:`InputError` naming the file otherwise: a FIFO would block forever and ``/dev/zero``
    never ends.  ``kind`` says what stragglar reads from it (``schedules``, ``traces``)."""
    name = shown(os.fspath(path))
    refuse_standard_input(path, kind)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"file not found: {name}") from None
    except OSError as e:
        raise InputError(f"cannot read {name}: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{name} is not a regular file (stragglar reads {kind} from files)")
    if limit is not None and info.st_size > limit:
        raise InputError(f"{name} has {info.st_size:,} bytes: stragglar reads files up to {limit:,}")
    try:
        return open(path, "rb")
    except OSError as e:
        raise InputError(f"cannot read {name}: {e.strerror or e}") from None


def refuse_standard_input(path: str | os.PathLike[str], kind: str) -> None:
    """``-``, where other tools read standard input, is refused as such, not as a missing file:
    stragglar reads ``kind`` from files, whose size it knows before it reads (a pipe may not end)."""
    if os.fspath(path) == "-":
        raise InputError(
            f"stragglar reads {kind} from files, not standard input ('-'; a file of that name: ./-)"
        )


def check_appendable(path: str | os.PathLike[str], kind: str) -> None:
    """Refuse, without making or opening anything, a ``path`` that :func:`open_appending` would
    refuse: a FIFO, a device or a directory, a file this process may not write, or one in a folder
    that is missing or not writable.  For a program that writes later and wants to fail now."""
    name = shown(os.fspath(path))
    try:
        info = os.stat(path)
    except FileNotFoundError:
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise InputError(f"cannot write {kind} to {name}: its folder does not exist") from None
        if not os.access(folder, os.W_OK):
            raise InputError(f"cannot write {kind} to {name}: its folder is not writable") from None
        return
    except OSError as e:
        raise InputError(f"cannot write {kind} to {name}: {e.strerror or e}") from None
    if not stat.S_ISREG(info.st_mode):
        raise InputError(f"{name} is not a regular file (stragglar writes {kind} to files)")
    if not os.access(path, os.W_OK):
        raise InputError(f"cannot write {kind} to {name}: permission denied")


def open_appending(path: str | os.PathLike[str], kind: str) -> int:
    """A descriptor appending to the regular file ``path`` (made if missing); an
    :class:`InputError` naming it otherwise.  Opened without blocking and checked after: a FIFO
    with no reader would block the open forever, and a device (``/dev/full``) or a directory is no
    place for ``kind`` (what stragglar writes there)."""
    name = shown(os.fspath(path))
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO that nothing reads, a folder
            raise InputError(f"{name} is not a regular file (stragglar writes {kind} to files)") from None
        raise InputError(f"cannot write {kind} to {name}: {e.strerror or e}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{name} is not a regular file (stragglar writes {kind} to files)")
    os.set_blocking(fd, True)
    return fd


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_DIGIT_LIMIT = re.compile(r"limit \((?P<limit>\d+) digits\).*value has (?P<has>\d+) digits")


def json_complaint(error: ValueError) -> str:
    """What Python's JSON parser said, in a user's words: its advice is for Python programmers
    (``use sys.set_int_max_str_digits()``), and "at" dangles before the place it adds.

    >>> json_complaint(ValueError("Exceeds the limit (4300 digits) for integer string conversion: "
    ...                           "value has 5000 digits; use sys.set_int_max_str_digits() to ..."))
    'a number has 5000 digits; at most 4300 are read'
    """
    if isinstance(error, json.JSONDecodeError):
        return f"{error.msg.removesuffix(' at')} at line {error.lineno} column {error.colno}"
    digits = _DIGIT_LIMIT.search(str(error))
    if digits is not None:
        return f"a number has {digits['has']} digits; at most {digits['limit']} are read"
    return str(error)


def lone_surrogate(text: str, document: Any) -> str | None:
    r"""What is wrong with the first string (key or value) of ``document``, parsed from the JSON
    ``text``, that is not valid Unicode, or None: a ``\ud800`` escape with no partner parses, but
    nothing can print or write the string, so a reader refuses it instead of failing on output.
    Only escapes make one (UTF-8 decoding refuses the rest), so a document whose text has none is
    cleared by one scan of the text, without walking it.

    >>> lone_surrogate('["ok"]', ["ok"]), lone_surrogate('["\\ud800x"]', ["\ud800x"])
    (None, "not valid Unicode: the string '\\\\ud800x' has half of a surrogate pair")
    """
    if _SURROGATE_ESCAPE.search(text) is None:
        return None
    stack = [document]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
            continue
        strings = list(item) if isinstance(item, dict) else [item] if isinstance(item, str) else []
        if isinstance(item, dict):
            stack.extend(item.values())
        for string in strings:
            try:
                string.encode("utf-8")
            except UnicodeEncodeError:
                shown = string.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
                return f"not valid Unicode: the string {shown!r} has half of a surrogate pair"
    return None


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether ``a`` and ``b`` name one file (links followed); a missing ``b`` is never ``a``, nor
    is a loop of links (which names no file)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        try:
            return Path(a).resolve() == Path(b).resolve()
        except (OSError, RuntimeError):  # a loop of links: RuntimeError on Python < 3.13
            return False


def write_text(path: str | os.PathLike[str], text: str) -> None:
    """Replace the file ``path`` with ``text`` (UTF-8), atomically."""
    write_bytes(path, text.encode("utf-8"))


def own_descriptor(path: str | os.PathLike[str]) -> int | None:
    """The descriptor of this process that ``path`` names, or None: ``/dev/stdout`` is 1, and so
    are ``/dev/fd/1``, ``/proc/self/fd/1``, ``/proc/<this pid>/fd/1`` and a link to any of them.

    Links are followed one at a time up to the descriptor's own (whose target is what the
    descriptor was opened on: a file, a pipe, a terminal), never through it.  Another process's
    descriptor is an :class:`InputError`: its file is not ours to replace.

    >>> own_descriptor("/dev/stdout"), own_descriptor(f"/proc/{os.getpid()}/fd/2"), own_descriptor("a.json")
    (1, 2, None)
    """
    name = os.fspath(path)
    for _ in range(_MAX_LINKS):
        folder = os.path.realpath(os.path.dirname(name) or ".")
        leaf = os.path.basename(name)
        found = _DESCRIPTORS.fullmatch(folder)
        if found is not None and _ASCII_NUMBER.fullmatch(leaf):  # not isdigit: superscripts
            if int(found[1]) != os.getpid():
                raise InputError(f"{shown(name)} is a descriptor of another process: write to a file")
            if len(leaf) > 10 or int(leaf) > _MAX_DESCRIPTOR:  # none is that large: os.fstat overflows
                raise InputError(f"{shown(name)}: no such descriptor")
            return int(leaf)
        full = os.path.join(folder, leaf)
        if not os.path.islink(full):
            return None
        try:
            name = os.path.join(folder, os.readlink(full))
        except OSError:
            return None
    return None


def check_replaceable(path: str | os.PathLike[str]) -> None:
    """Refuse an output that exists and is not a regular file: the atomic rename would put a plain
    file where the device, FIFO or socket was (``/dev/null`` deleted).  A link to nothing is
    refused too: the file it names may be anywhere (``cp`` will not write through one either).
    One of this process's descriptors is fine: it is written as it is (:func:`own_descriptor`)."""
    if own_descriptor(path) is not None:
        return
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{shown(target)} is a folder: name a file in it")
    if target.exists() and not target.is_file():
        raise InputError(f"{shown(target)} is not a regular file (a device, fifo or socket): write to a file")
    if target.is_symlink() and not target.exists():
        if is_link_loop(target):
            raise InputError(f"{shown(target)} is a loop of symbolic links: write to a file")
        raise InputError(f"{shown(target)} is a symbolic link to a missing file: write to a file")
    if target.exists() and not os.access(target, os.W_OK):
        # the rename needs only the folder's permission: another user's read-only file was replaced,
        # and became ours, where the shell's ">" refuses it
        raise _as_written(PermissionError(errno.EACCES, os.strerror(errno.EACCES)), path)


def is_link_loop(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names a loop of symbolic links (the system's ELOOP, on any Python: pathlib's
    ``resolve`` raises RuntimeError for one before Python 3.13, and returns it unresolved after)."""
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file ``path`` (a link's target, where it is a link) with ``data``, atomically;
    on failure the old file is untouched.  One of this process's descriptors gets ``data``
    written to it instead (:func:`own_descriptor`).  The temporary is locked while it is written:
    one that a writer killed outright left (SIGKILL leaves no chance to remove it) is removed by
    the next write of the same file (:func:`_abandoned`); SIGTERM and SIGHUP wait until the write
    is done where the command asks it (:func:`stops_wait_for_writes`)."""
    descriptor = own_descriptor(path)
    if descriptor is not None:
        _write_descriptor(descriptor, data)
        return
    check_replaceable(path)
    target = Path(os.path.realpath(path))
    prefix = f".{target.name}.stragglar-"
    _sweep(target.parent, prefix, folders=False)
    with _stops_deferred():
        _replace(path, target, prefix, data)


def _replace(path: str | os.PathLike[str], target: Path, prefix: str, data: bytes) -> None:
    """:func:`write_bytes`'s temporary file and rename."""
    try:
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=".tmp")
    except OSError as e:  # a missing folder, no permission
        raise _as_written(e, path) from None
    try:
        _lock(fd)  # released when the file closes, or its writer dies
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        mode = target.stat().st_mode & 0o777 if target.exists() else 0o666 & ~_umask()
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException as e:  # the old file untouched, the temporary gone
        Path(temporary).unlink(missing_ok=True)
        if isinstance(e, OSError):  # a full disk
            raise _as_written(e, path) from None
        raise


@contextlib.contextmanager
def stops_wait_for_writes() -> Iterator[None]:
    """Within this block (the ``stragglar`` command runs in one), SIGTERM and SIGHUP that arrive
    while a file is written wait until the write is done, then take their course (their default
    ends the process, with 143 or 129, as it would have): ended in the middle of a write, the
    command left its temporary file beside the output until the next write of the same file swept
    it (the default action runs no ``finally``).  A write is bounded by its data; SIGINT needs no
    wait, as its KeyboardInterrupt removes the temporary.

    The command's own process only: it sets Python handlers for the length of a write, which in a
    program of the user's would drop a handler installed from C since Python started (Python's
    table reads it as the default) and deliver a signal twice to an asyncio loop's handler."""
    token = _HOLD_STOPS.set(True)
    try:
        yield
    finally:
        _HOLD_STOPS.reset(token)


@contextlib.contextmanager
def _stops_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGHUP for a write where :func:`stops_wait_for_writes` asks it: in the main
    thread (where Python runs handlers) and where the signal is neither ignored (``nohup``) nor
    handled from C before Python started."""
    if not _HOLD_STOPS.get() or threading.current_thread() is not threading.main_thread():
        yield
        return
    arrived: list[int] = []
    previous: dict[int, Any] = {}
    try:
        for s in _STOPS:
            handler = signal.getsignal(s)
            if handler not in (signal.SIG_IGN, None):
                previous[s] = handler  # first: signal.signal runs a pending SIGINT's handler (which
                signal.signal(s, lambda signum, _frame: arrived.append(signum))  # raises) before it sets
        yield
    finally:
        try:
            _restore(previous)
        finally:  # a stop that came takes its course, a KeyboardInterrupt in the restore or not
            for signum in dict.fromkeys(arrived):
                signal.raise_signal(signum)


def _restore(handlers: dict[int, Any]) -> None:
    """Put every handler back, even where a pending signal's handler raises as one is put back
    (``signal.signal`` runs pending handlers before it sets the new one: a KeyboardInterrupt there
    left that one and the rest holding)."""
    raised: BaseException | None = None
    for signum, handler in handlers.items():
        try:
            signal.signal(signum, handler)
        except BaseException as e:  # raised once every handler is back
            raised = raised or e
            signal.signal(signum, handler)
    if raised is not None:
        raise raised


@contextlib.contextmanager
def working_folder(prefix: str) -> Iterator[str]:
    """A temporary folder (named ``prefix`` and random letters) for this process and the children
    it forks, removed when the work ends, and by the next caller of the same ``prefix`` if this
    process was killed outright: the folder's lock is held as long as any process holding it lives
    (SIGKILL of a launcher left its rendezvous and stack files behind for good)."""
    root = Path(tempfile.gettempdir())
    _sweep(root, prefix, folders=True)
    with tempfile.TemporaryDirectory(prefix=prefix) as folder:
        fd = os.open(os.path.join(folder, _LOCK), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            _lock(fd)
            yield folder
        finally:
            os.close(fd)


_LOCK = ".lock"  # a working folder's lock
ABANDONED_AFTER = 60.0  # seconds: an unlocked temporary older than this was left by a killed process


def _lock(fd: int) -> None:
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX)


def _sweep(folder: Path, prefix: str, folders: bool) -> None:
    """Remove this user's abandoned temporaries in ``folder``: working folders (``folders``) or
    the files an atomic write makes, named ``prefix`` and random letters.  Any that cannot be
    looked at or removed are left: sweeping is a courtesy, never a reason to fail."""
    if fcntl is None:  # no lock tells a live maker from a dead one
        return
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix) or (not folders and not entry.name.endswith(".tmp")):
            continue
        try:
            kind_ok = entry.is_dir(follow_symlinks=False) if folders else entry.is_file(follow_symlinks=False)
            if not kind_ok or entry.stat(follow_symlinks=False).st_uid != os.getuid():
                continue
            if _abandoned(os.path.join(entry.path, _LOCK) if folders else entry.path):
                if folders:
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    os.unlink(entry.path)
        except OSError:
            continue


def _abandoned(lock: str) -> bool:
    """Whether the file ``lock`` is older than :data:`ABANDONED_AFTER` and nobody holds its lock: a
    lock goes with the last process holding it, killed or not, and the age leaves alone a
    temporary so new that its maker has yet to lock it."""
    try:
        if time.time() - os.stat(lock, follow_symlinks=False).st_mtime < ABANDONED_AFTER:
            return False
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        assert fcntl is not None  # _sweep asks only where there are locks
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its maker lives
        return False
    finally:
        os.close(fd)
    return True


def _as_written(error: OSError, path: str | os.PathLike[str]) -> OSError:
    """``error`` of a write, named by the file asked for rather than its temporary, its type and
    errno kept (a full disk is still one: exit 3)."""
    return type(error)(error.errno, error.strerror, os.fspath(path))


def _write_descriptor(descriptor: int, data: bytes) -> None:
    """Write all of ``data`` to the open ``descriptor``, after what Python still holds for stdout
    and stderr (so that the lines printed before it come before it)."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: closed before the start
            stream.flush()
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
