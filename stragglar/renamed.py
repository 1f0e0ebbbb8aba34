"""Old names that still work: each use warns (a :class:`DeprecationWarning`, shown where Python's
filters show deprecations: in a script's own code and under pytest) and says what to use
instead, so that a program built on an old name learns of it before the name goes (the README's
"Renamed names" lists them)."""

from __future__ import annotations

import functools
import types
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["RenamedModule", "renamed"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def renamed(old: str, new: str, function: _F) -> _F:
    """``function`` under its old name ``old``: every call warns, naming ``new``."""

    @functools.wraps(function)
    def old_name(*args: Any, **kwargs: Any) -> Any:
        _warn(old, new)
        return function(*args, **kwargs)

    # where it is found, so that pickle finds this very function there (wraps took the new one's)
    old_name.__module__, _, old_name.__qualname__ = old.rpartition(".")
    return old_name  # type: ignore[return-value]


class RenamedModule(types.ModuleType):
    """A module's old name, for ``sys.modules``: each name taken from it warns, naming the module
    to import instead, and is that module's."""

    def __init__(self, old: str, module: types.ModuleType) -> None:
        super().__init__(old, module.__doc__)
        self._module = module
        # what the import system reads of a module is the module's own (ModuleType set them None)
        self.__spec__, self.__loader__ = module.__spec__, module.__loader__
        self.__package__ = module.__package__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # a module's own dunders (its file, path): no name of the API
            return getattr(self._module, name)
        _warn(f"{self.__name__}.{name}", f"{self._module.__name__}.{name}")
        return getattr(self._module, name)

    def __dir__(self) -> list[str]:
        return dir(self._module)
