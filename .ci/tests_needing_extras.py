"""The test modules whose outcome can depend on torch or CuPy being installed, one path a line.

CI runs the fast tier twice: first the README's command in a venv without torch or CuPy, then
in a venv with both.  The second run needs only these modules (and the package's doctests): a
test can only behave differently with torch or CuPy installed where it, or a helper module of
``tests/`` it imports (or names as a string: ``-p gpu_stand_in``), names one of them: as an
import or an attribute (``torch.float16``), as a module name given as a string
(``pytest.importorskip("torch")``, ``find_spec("cupy")``), or in Python source held in a string (a
script run in a subprocess: ``import torch``, ``in ("torch", "cupy")``).  A test that does none
of these runs the same code in both venvs, and it passed in the first.

``--check LOG`` holds the list to the first run's own output: every test file that run skipped
for want of torch or CuPy must be listed, or the selection missed one (exit 1)."""

from __future__ import annotations

import argparse
import io
import itertools
import re
import sys
import tokenize
from pathlib import Path

EXTRAS = ("torch", "cupy")
# Python 3.12 splits an f-string into tokens of its own; its text parts are FSTRING_MIDDLE.
STRINGS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
TESTS = Path(__file__).resolve().parent.parent / "tests"


IN_SOURCE = re.compile(r"""\b(import|from)\s+(torch|cupy)\b|["'](torch|cupy)(\.\w+)*["']""")


def _names_an_extra(token: tokenize.TokenInfo) -> bool:
    if token.type == tokenize.NAME:
        return token.string in EXTRAS
    if token.type in STRINGS:
        text = _content(token)
        as_name = text.partition(".")[0] in EXTRAS and text.replace(".", "").isidentifier()
        return as_name or bool(IN_SOURCE.search(text))
    return False


def _content(token: tokenize.TokenInfo) -> str:
    """A string token's text without its prefix and quotes (escapes left as they are)."""
    if token.type != tokenize.STRING:
        return token.string
    text = token.string.lstrip("rRbBuUfF")
    quote = text[:3] if text[:3] in ('"""', "'''") else text[:1]
    return text[len(quote) : len(text) - len(quote)]


def _scan(path: Path) -> tuple[bool, set[str]]:
    """Whether the module names torch or CuPy itself, and the names it imports (its possible helpers)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(path.read_text()).readline))
    imported = {
        after.string
        for before, after in itertools.pairwise(tokens)
        if before.string in ("import", "from") and after.type == tokenize.NAME
    } | {_content(token) for token in tokens if token.type in STRINGS}
    return any(_names_an_extra(token) for token in tokens), imported


def needing_extras(tests: Path = TESTS) -> list[Path]:
    """Every ``test_*.py`` under ``tests`` that names torch or CuPy, directly or through helpers."""
    scanned = {path.stem: _scan(path) for path in sorted(tests.glob("*.py"))}
    names = {stem for stem, (direct, _) in scanned.items() if direct}
    growing = True
    while growing:  # a helper that imports a helper naming torch names it too
        more = {stem for stem, (_, imported) in scanned.items() if imported & names} - names
        names |= more
        growing = bool(more)
    return [tests / f"{stem}.py" for stem in sorted(names) if stem.startswith("test_")]


SKIP_LINE = re.compile(r"^SKIPPED \[\d+\] (?P<path>[^:]+\.py):\d+: (?P<reason>.*)$")
NAMES_AN_EXTRA = re.compile(r"\b(torch|cupy|CuPy)\b")


def missed(log: str, listed: list[Path]) -> list[str]:
    """The test files the log shows skipped for want of torch or CuPy that ``listed`` lacks."""
    root = TESTS.parent
    have = {str(path.relative_to(root)) for path in listed}
    skipped = {
        match["path"]
        for match in map(SKIP_LINE.match, log.splitlines())
        if match and match["path"].startswith("tests/") and NAMES_AN_EXTRA.search(match["reason"])
    }
    return sorted(skipped - have)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--check", metavar="LOG", type=Path, help="the first run's output")
    args = parser.parse_args()
    listed = needing_extras()
    if args.check is not None:
        lost = missed(args.check.read_text(), listed)
        if lost:
            print(f"skipped without torch or CuPy but not selected: {', '.join(lost)}", file=sys.stderr)
            return 1
        print(f"every test file skipped without torch or CuPy is among the {len(listed)} selected")
        return 0
    print("\n".join(str(path.relative_to(TESTS.parent)) for path in listed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
