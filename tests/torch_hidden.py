"""Python source that, run first in a fresh interpreter, makes torch and CuPy unimportable: what
the base install (no torch) looks like, on a machine that has them."""

from __future__ import annotations

import textwrap

HIDE_TORCH = textwrap.dedent(
    """
    import sys

    class Hidden:
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in ("torch", "cupy"):
                raise ImportError(f"{name} is hidden")
            return None

    sys.meta_path.insert(0, Hidden())
    """
)
