"""The CuPy stand-ins held to the real CuPy's names and signatures, and kernel launches to their C types.

The GPU engines are tested on CPU against stand-ins of CuPy (:mod:`fake_cupy`,
:mod:`fake_device`), which answer whatever they are asked: a misspelt name, a keyword CuPy does
not take or a method of the wrong object would pass every CPU test and fail at the first call on
a GPU.  CuPy itself imports without a GPU (only its calls need one), so where it is installed
:func:`watched` wraps a stand-in: every name the code reads on it must exist on the real object
in the same place, every call must bind to the real callable's signature (read from
``inspect`` or from the first line of the docstring Cython writes), and every kernel launch's
arguments must have the C types of the kernel's parameters in the module's source (the stand-ins
convert whatever they are given; CuPy passes each argument at its own width, so one of the wrong
width would shift every argument after it).  A breach fails the test at
once, with ``pytest.fail``, which no ``except Exception`` in the code under test can swallow; it
is also kept, so that one made in a thread of the stand-in's fails the test at its teardown
(:meth:`Surface.check`).  Where CuPy is not installed, :func:`watched` gives the stand-in back
as it is."""

from __future__ import annotations

import importlib
import inspect
import operator
import re
import threading
import types
from typing import Any, NoReturn

import numpy as np
import pytest

__all__ = [
    "REAL",
    "RETURNS",
    "Declared",
    "Surface",
    "argument_breach",
    "bare",
    "declared_breach",
    "kernel_parameters",
    "resolve",
    "signature",
    "watched",
]


def _real_cupy() -> types.ModuleType | None:
    """The installed CuPy, imported before any test puts a stand-in in its place; None without one."""
    try:
        module = importlib.import_module("cupy")
    except Exception:  # not installed, or its libraries missing: nothing to hold the stand-ins to
        return None
    return module if getattr(module, "__file__", None) else None


REAL: Any = _real_cupy()  # the module, or None

# What the real callables return, where the code reads or calls something on the result: by the
# real callable's place (module or class name, then the attribute).  A call whose result the code
# uses and that is missing here fails, so that nothing a stand-in returns goes unchecked.
RETURNS: dict[str, str] = {
    "cupy.cuda.get_current_stream": "cupy.cuda.Stream",
    "cupy.cuda.get_allocator": "",  # an allocator: a callable of CuPy's own that the code only hands back
    "cupy.cuda.using_allocator": "contextlib.AbstractContextManager",
    "cupy.cuda.Stream.record": "cupy.cuda.Event",
    "cupy.cuda.Stream.end_capture": "cupy.cuda.Graph",
    "cupy.RawModule.get_function": "cupy.RawKernel",
}

# Attributes CuPy sets on an instance as it is made, which its class does not show: by the class's
# place (documented in the class's docstring, set in its ``__init__``: cupy/cuda/stream.pyx).
FIELDS: dict[str, frozenset[str]] = {"cupy.cuda.Stream": frozenset({"ptr", "device_id"})}

# Results that are data, not CuPy objects: passed on unwatched (an array's own members are
# checked by test_cupy_surface.py against cupy.ndarray's).
_DATA = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    tuple,
    list,
    dict,
    np.ndarray,
    np.generic,
    np.dtype,
)


class Surface:
    """The breaches seen so far, by every watcher of one stand-in."""

    def __init__(self) -> None:
        self.breaches: list[str] = []
        self.own: set[str] = set()  # names a test set on the stand-in that CuPy has not: the test's own
        # the stand-in's ``cupy.ndarray``: what a kernel's pointer argument must be
        self.device_array: type = np.ndarray
        self.lock = threading.Lock()

    def breach(self, line: str) -> NoReturn:
        with self.lock:
            self.breaches.append(line)
        pytest.fail(f"real CuPy: {line}", pytrace=False)

    def check(self) -> None:
        """Fail if any breach was seen, in whichever thread."""
        if self.breaches:
            pytest.fail("real CuPy: " + "; ".join(sorted(set(self.breaches))), pytrace=False)


def watched(stand_in: Any, surface: Surface) -> Any:
    """``stand_in`` (a stand-in of the ``cupy`` module) watched against the real CuPy, or
    ``stand_in`` itself where CuPy is not installed."""
    if REAL is None:
        return stand_in
    surface.device_array = stand_in.ndarray
    return _Watched(stand_in, REAL, "cupy", surface, key="cupy")


# A kernel's C parameter types, and the NumPy scalar CuPy must be given for each: CuPy passes a
# scalar argument with its own width (a Python int as 64 bits, a float as a double), so an
# argument of another width shifts every argument after it; a pointer takes a device array.
_SCALARS: dict[str, type] = {
    "int": np.int32,
    "unsigned int": np.uint32,
    "unsigned": np.uint32,
    "long long": np.int64,
    "unsigned long long": np.uint64,
    "float": np.float32,
    "double": np.float64,
    "bool": np.bool_,
}


def kernel_parameters(code: str, name: str) -> list[str] | None:
    """The C types of the parameters of the kernel ``name`` (a name expression, such as
    ``run_program<FloatSum, 1>``) in ``code``; None where ``code`` defines no such kernel."""
    base = re.escape(name.split("<", 1)[0].strip())
    found = re.search(rf"__global__\s+void\s+{base}\s*\(([^)]*)\)", code)
    if found is None:
        return None
    types = []
    for parameter in found.group(1).split(","):
        words = [w for w in parameter.replace("*", " * ").split()[:-1] if w not in ("const", "__restrict__")]
        types.append(" ".join(words))
    return types


def argument_breach(types: list[str], arguments: tuple[Any, ...], device_array: type) -> str | None:
    """Why CuPy would pass ``arguments`` wrongly to a kernel whose parameters are of ``types``;
    None where each is what its parameter takes."""
    if len(arguments) != len(types):
        return f"{len(arguments)} arguments for {len(types)} parameters"
    for i, (ctype, value) in enumerate(zip(types, arguments, strict=True)):
        if ctype.endswith("*"):
            if not isinstance(value, device_array):
                return f"argument {i} ({ctype}) is a {type(value).__name__}, not a device array"
            continue
        want = _SCALARS.get(ctype)
        if want is None:
            return f"argument {i}: no rule for the C type {ctype!r}"
        if not (isinstance(value, np.generic) and value.dtype == np.dtype(want)):
            return f"argument {i} ({ctype}) is a {type(value).__name__}, not a numpy.{np.dtype(want).name}"
    return None


def _place(real: Any) -> str:
    """Where the code reaches a real module or class: ``cupy.cuda.Stream``, not the module that
    defines it; "" for anything else."""
    if isinstance(real, types.ModuleType):
        return real.__name__
    if isinstance(real, type):
        name = real.__name__
        for public in ("cupy.cuda", "cupy"):
            if getattr(resolve(public), name, None) is real:
                return f"{public}.{name}"
        return f"{real.__module__}.{name}"
    return ""


def resolve(place: str) -> Any:
    """The real object at ``place``: CuPy's read from the real module (``sys.modules["cupy"]``
    may hold a stand-in meanwhile), any other imported."""
    first, *rest = place.split(".")
    found: Any = REAL if first == "cupy" else importlib.import_module(first)
    for name in rest:
        found = getattr(found, name)
    return found


def signature(real: Any) -> inspect.Signature | None:
    """``real``'s signature, from ``inspect`` or from the first line of its docstring (Cython
    writes ``name(type name=default, *, ...)`` there); None where neither says."""
    try:
        return inspect.signature(real)
    except (TypeError, ValueError):
        pass
    first = (getattr(real, "__doc__", None) or "").strip().split("\n", 1)[0]
    match = re.fullmatch(r"[\w.]+\((.*)\)\s*(->.*)?", first)
    if match is None:
        return None
    parameters: list[inspect.Parameter] = []
    kind: Any = inspect.Parameter.POSITIONAL_OR_KEYWORD
    for part in _split(match.group(1)):
        if part in ("*", "/"):
            if part == "*":
                kind = inspect.Parameter.KEYWORD_ONLY
            continue
        left, default = part.partition("=")[0].strip(), "=" in part
        name = left.split()[-1]
        if name.startswith("**"):
            parameters.append(inspect.Parameter(name[2:], inspect.Parameter.VAR_KEYWORD))
        elif name.startswith("*"):
            parameters.append(inspect.Parameter(name[1:], inspect.Parameter.VAR_POSITIONAL))
            kind = inspect.Parameter.KEYWORD_ONLY
        else:
            declared = Declared(" ".join(left.split()[:-1]))
            empty = inspect.Parameter.empty
            parameters.append(
                inspect.Parameter(
                    name, kind, default=None if default else empty, annotation=declared or empty
                )
            )
    return inspect.Signature(parameters)


class Declared(str):
    """A parameter's type as a Cython docstring declares it (``bytes``, ``size_t``): Cython
    checks it at the call, raising a TypeError that a stand-in would never raise."""


_OBJECTS: dict[str, type] = {"str": str, "bytes": bytes, "tuple": tuple, "list": list, "dict": dict}
_INTEGERS = {
    "int",
    "unsigned int",
    "long",
    "unsigned long",
    "long long",
    "unsigned long long",
    "size_t",
    "ssize_t",
    "Py_ssize_t",
    "intptr_t",
    "uintptr_t",
}


def declared_breach(shape: inspect.Signature, arguments: dict[str, Any]) -> str | None:
    """Why Cython would refuse ``arguments`` (bound to ``shape``) for their declared types; None
    where it takes them.  An object type takes None too; a C integer takes what has an
    ``__index__`` (a Python or NumPy integer, not a float)."""
    for name, value in arguments.items():
        declared = shape.parameters[name].annotation
        if not isinstance(declared, Declared):
            continue
        kind = _OBJECTS.get(declared)
        if kind is not None and value is not None and not isinstance(value, kind):
            return f"{name} is a {type(value).__name__}, where CuPy declares {declared}"
        if declared in _INTEGERS:
            try:
                operator.index(value)
            except TypeError:
                return f"{name} is a {type(value).__name__}, where CuPy declares the C integer {declared}"
    return None


def _split(parameters: str) -> list[str]:
    """A parameter list's parts, cut at the commas outside brackets and quotes."""
    parts, depth, quote, start = [], 0, "", 0
    for i, c in enumerate(parameters):
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(parameters[start:i].strip())
            start = i + 1
    parts.append(parameters[start:].strip())
    return [p for p in parts if p]


def _data(value: Any) -> bool:
    """A value the code reads as data, not a CuPy object to watch further."""
    return isinstance(value, _DATA) or (
        isinstance(value, type) and issubclass(value, (np.ndarray, np.generic))
    )


def bare(value: Any) -> Any:
    """A watched object's stand-in (inside tuples too): for the stand-in's calls, and for a test that
    reads what the stand-in noted (which the real CuPy has not)."""
    if isinstance(value, _Watched):
        return object.__getattribute__(value, "_inner")
    if isinstance(value, tuple):
        return tuple(bare(v) for v in value)
    return value


class _Watched:
    """A stand-in's object, with ``real``: what the real CuPy has in its place (for an instance,
    its class; ``instance`` says which), and ``key``: the real object's place, by which
    :data:`RETURNS` names what a call of it gives.  ``bound``: a method read on an instance,
    whose real counterpart takes ``self`` first."""

    __slots__ = ("_bound", "_context", "_inner", "_instance", "_key", "_path", "_real", "_surface")
    _bound: bool
    _context: Any
    _inner: Any
    _instance: bool
    _key: str
    _path: str
    _real: Any
    _surface: Surface

    def __init__(
        self,
        inner: Any,
        real: Any,
        path: str,
        surface: Surface,
        *,
        key: str = "",
        instance: bool = False,
        bound: bool = False,
        context: Any = None,
    ) -> None:
        for name, value in (
            ("_context", context),
            ("_inner", inner),
            ("_real", real),
            ("_path", path),
            ("_surface", surface),
            ("_key", key),
            ("_instance", instance),
            ("_bound", bound),
        ):
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        self._known()
        inner = getattr(self._inner, name)
        path = f"{self._path}.{name}"
        if path in self._surface.own:
            return inner
        real = getattr(self._real, name, _MISSING)
        if real is _MISSING and self._instance and name in FIELDS.get(_place(self._real) or "", ()):
            return inner  # an instance's own field: data
        if real is _MISSING:
            self._surface.breach(f"{_place(self._real) or self._real!r} has no {name!r} (read as {path})")
        if _data(inner):
            return inner
        place = _place(self._real)
        return _Watched(
            inner,
            real,
            path,
            self._surface,
            key=f"{place}.{name}" if place else "",
            bound=self._instance and callable(real) and not isinstance(real, type),
            context=self._context,
        )

    def _known(self) -> None:
        """Fail where the code uses a result whose real counterpart is not known."""
        if isinstance(self._real, _Unknown):
            self._surface.breach(f"{self._real.what} is not in cupy_surface.RETURNS (used as {self._path})")

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._inner, name, value)
        if not hasattr(self._real, name):
            self._surface.own.add(f"{self._path}.{name}")

    def __delattr__(self, name: str) -> None:
        delattr(self._inner, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self._known()
        args, kwargs = bare(args), {k: bare(v) for k, v in kwargs.items()}
        real, bound = (_instance_call(self._real), True) if self._instance else (self._real, self._bound)
        shape = signature(real)
        if shape is None:
            self._surface.breach(f"no signature to check {self._path}(...) against")
        try:
            given = shape.bind(*((None,) if bound else ()), *args, **kwargs).arguments
        except TypeError as refused:
            self._surface.breach(f"{self._path}{shape} refuses {_call(args, kwargs)}: {refused}")
        why = declared_breach(shape, given)
        if why is not None:
            self._surface.breach(f"{self._path}(...): {why}")
        context = self._kernels(given)
        result = self._inner(*args, **kwargs)
        if _data(result):
            return result
        if isinstance(self._real, type) and not self._instance:
            return _Watched(
                result, self._real, f"{self._path}()", self._surface, instance=True, context=context
            )
        place = RETURNS.get(self._key)
        if place == "":
            return result
        real = resolve(place) if place else _Unknown(f"what {self._key or self._path}() returns")
        return _Watched(result, real, f"{self._path}()", self._surface, instance=True, context=context)

    def _kernels(self, given: dict[str, Any]) -> Any:
        """What a module's kernels carry from call to call (a module's code, then a kernel's C
        parameter types), and the check of a kernel's arguments against its parameters."""
        if self._key == "cupy.RawModule":
            return given.get("code")
        if self._key == "cupy.RawModule.get_function":
            types = kernel_parameters(self._context or "", given["name"])
            if types is None:
                self._surface.breach(f"the module's code defines no kernel {given['name']!r}")
            return types
        if self._instance and self._real is REAL.RawKernel:
            why = argument_breach(self._context, tuple(given["args"]), self._surface.device_array)
            if why is not None:
                self._surface.breach(f"a kernel launch ({self._path}): {why}")
        return None

    def __enter__(self) -> Any:
        self._known()
        if not hasattr(self._real, "__enter__"):
            self._surface.breach(f"{_place(self._real)} is no context manager (entered as {self._path})")
        entered = self._inner.__enter__()
        return self if entered is self._inner else entered

    def __exit__(self, *exc: object) -> Any:
        return self._inner.__exit__(*exc)

    def __eq__(self, other: object) -> bool:
        return bool(self._inner == bare(other))

    def __hash__(self) -> int:
        return hash(self._inner)

    def __repr__(self) -> str:
        return f"watched({self._inner!r})"


def _instance_call(real: type) -> Any:
    """What calling an instance of ``real`` runs (None: its instances are not callable)."""
    return next((k.__dict__["__call__"] for k in real.__mro__ if "__call__" in k.__dict__), None)


def _call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    shown = [type(a).__name__ for a in args] + [f"{k}=" for k in kwargs]
    return f"({', '.join(shown)})"


class _Unknown:
    """The real counterpart of a call's result that :data:`RETURNS` does not name."""

    def __init__(self, what: str) -> None:
        self.what = what


_MISSING = object()
