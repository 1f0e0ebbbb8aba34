"""The watcher that holds the CuPy stand-ins to the real CuPy (:mod:`cupy_surface`): each kind of
breach it exists to catch is caught, what is right passes, and the stand-ins' arrays have CuPy's
members.  Needs CuPy installed (it imports without a GPU); CI installs it for these."""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
import types
from typing import Any

import numpy as np
import pytest
from cupy_surface import (
    FIELDS,
    REAL,
    RETURNS,
    Surface,
    bare,
    kernel_parameters,
    resolve,
    signature,
    watched,
)
from fake_cupy import FakeArray
from fake_device import DeviceArray

if REAL is None:
    pytest.skip("CuPy is not installed", allow_module_level=True)


class Permissive:
    """A stand-in that takes any call and has any name: only the watcher can refuse."""

    def __init__(self, **names: Any) -> None:
        self.__dict__.update(names)

    def __getattr__(self, name: str) -> Permissive:
        return Permissive()

    def __call__(self, *args: Any, **kwargs: Any) -> Permissive:
        return Permissive()

    def __enter__(self) -> Permissive:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def stand_in() -> Permissive:
    return Permissive(ndarray=FakeArray)


def breach(use: Any) -> str:
    """The line the watcher fails ``use`` with (it must fail)."""
    surface = Surface()
    with pytest.raises(pytest.fail.Exception) as failed:
        use(watched(stand_in(), surface))
    assert surface.breaches, "failed, but not by the watcher"
    return str(failed.value)


def passes(use: Any) -> Surface:
    surface = Surface()
    use(watched(stand_in(), surface))
    surface.check()
    return surface


def test_a_name_the_real_cupy_lacks_fails() -> None:
    assert "'cupy.cuda' has no 'Streem'" in breach(lambda cupy: cupy.cuda.Streem)
    assert "'cupy.cuda.Stream' has no 'begin_capturing'" in breach(
        lambda cupy: cupy.cuda.Stream().begin_capturing
    )


def test_a_call_the_real_signature_refuses_fails() -> None:
    # a keyword CuPy does not take, on a Python class
    assert "refuses" in breach(lambda cupy: cupy.cuda.Stream(nonblocking=True))
    # too many arguments, to a Cython function whose signature is only in its docstring
    assert "refuses" in breach(lambda cupy: cupy.cuda.runtime.ipcOpenMemHandle(b"h", 1, 2))
    # a method's keyword, on an instance (the real method takes self first)
    assert "refuses" in breach(lambda cupy: cupy.cuda.Stream().record(stream=None))
    # a kernel called without all of its arguments (calling an instance: its class's __call__)
    assert "refuses" in breach(lambda cupy: kernel(cupy)(1, 2))


KERNEL = (
    "template <typename T>\n"
    "__global__ void k(int n, const long long* rows, typename T::Word *out, double x) {}"
)


def kernel(cupy: Any) -> Any:
    return cupy.RawModule(code=KERNEL, name_expressions=["k<Sum>"]).get_function("k<Sum>")


def test_kernel_arguments_must_have_their_parameters_c_types() -> None:
    device = np.zeros(2, dtype=np.int64).view(FakeArray)
    right = (np.int32(3), device, device, np.float64(0.5))
    passes(lambda cupy: kernel(cupy)((1,), (32,), right))
    wrong = {
        "argument 0 (int) is a int, not a numpy.int32": (3, device, device, np.float64(0.5)),
        "argument 0 (int) is a int64, not a numpy.int32": (np.int64(3), device, device, np.float64(0.5)),
        "argument 1 (long long *) is a ndarray, not a device array": (np.int32(3), np.zeros(2), device, 0.5),
        "argument 2 (typename T::Word *) is a int, not a device array": (np.int32(3), device, 7, 0.5),
        "argument 3 (double) is a float, not a numpy.float64": (np.int32(3), device, device, 0.5),
        "3 arguments for 4 parameters": right[:3],
    }
    for line, arguments in wrong.items():
        assert line in breach(lambda cupy, a=arguments: kernel(cupy)((1,), (32,), a)), line
    assert "defines no kernel 'j'" in breach(lambda cupy: cupy.RawModule(code=KERNEL).get_function("j"))


def test_kernel_parameters_are_read_from_the_source() -> None:
    assert kernel_parameters(KERNEL, "k<Sum>") == ["int", "long long *", "typename T::Word *", "double"]
    assert kernel_parameters(KERNEL, "j") is None
    from stragglar.runtime.device.kernel import SOURCE, kernel_name

    types = kernel_parameters(SOURCE, kernel_name("float32"))
    assert types is not None and types[:3] == ["long long *", "int", "int"] and types[-1] == "int"


def test_an_argument_of_a_type_cython_refuses_fails() -> None:
    assert "options is a list, where CuPy declares tuple" in breach(
        lambda cupy: cupy.RawModule(code=KERNEL, options=["--std=c++14"])
    )
    assert "handle is a str, where CuPy declares bytes" in breach(
        lambda cupy: cupy.cuda.runtime.ipcOpenMemHandle("handle")
    )
    assert "size is a float, where CuPy declares the C integer size_t" in breach(
        lambda cupy: cupy.cuda.runtime.malloc(1.5)
    )
    passes(lambda cupy: (cupy.cuda.runtime.malloc(np.uint64(8)), cupy.RawModule(code=KERNEL, options=())))


def test_what_the_real_cupy_takes_passes() -> None:
    device = np.zeros(2, dtype=np.int64).view(FakeArray)

    def use(cupy: Any) -> None:
        stream = cupy.cuda.Stream(non_blocking=True)
        with stream:
            stream.begin_capture()
            stream.end_capture().launch(stream)
        stream.wait_event(cupy.cuda.get_current_stream().record())
        cupy.cuda.Event(disable_timing=True).record(stream)
        launched = cupy.RawModule(code=KERNEL, options=("--std=c++14",), name_expressions=["k<S>"])
        launched.get_function("k<S>")((1,), (64,), (np.int32(1), device, device, np.float64(2)))
        with cupy.cuda.Device(0):
            cupy.cuda.runtime.ipcOpenMemHandle(b"h", 1)
            cupy.cuda.runtime.memset(0, 0, 8)

    passes(use)


def test_a_call_whose_result_is_not_known_fails_when_the_result_is_used() -> None:
    assert "not in cupy_surface.RETURNS" in breach(lambda cupy: cupy.cuda.get_device_id().anything)


def test_every_return_named_is_a_real_callable_s_and_a_real_class() -> None:
    for callable_place, returned in RETURNS.items():
        assert callable(resolve(callable_place)), callable_place
        assert returned == "" or isinstance(resolve(returned), type), returned


def test_an_instance_s_own_fields_are_the_ones_cupy_documents_and_only_on_instances() -> None:
    """``Stream().ptr`` is set as a stream is made, so its class does not show it: the watcher
    takes such a field from :data:`cupy_surface.FIELDS`, each one the class (or a base) documents
    as an attribute, and only on an instance."""
    for place, names in FIELDS.items():
        real = resolve(place)
        documented = "".join(cls.__doc__ or "" for cls in real.__mro__)
        short = place.rsplit(".", 1)[1]
        assert all(f"~{short}.{name}" in documented for name in names), (place, names)
    passes(lambda cupy: cupy.cuda.Stream().ptr)
    assert "'cupy.cuda.Stream' has no 'ptr'" in breach(lambda cupy: cupy.cuda.Stream.ptr)
    assert "has no 'handle'" in breach(lambda cupy: cupy.cuda.Stream().handle)


def test_a_name_a_test_sets_on_the_stand_in_is_its_own() -> None:
    def use(cupy: Any) -> None:
        cupy.noted = Permissive(count=3)
        assert cupy.noted.count == 3  # the real CuPy has no "noted": the test's, not checked

    passes(use)

    def replaced(cupy: Any) -> Any:
        cupy.cuda = Permissive()
        return cupy.cuda.Streem

    assert "has no 'Streem'" in breach(replaced)  # a name CuPy has stays checked once a test replaces it


def test_a_breach_swallowed_in_a_thread_fails_the_check_afterwards() -> None:
    surface = Surface()
    cupy = watched(Permissive(), surface)

    def swallowing() -> None:
        with contextlib.suppress(BaseException):  # as a thread of the code under test might
            print(cupy.cuda.Streem)

    thread = threading.Thread(target=swallowing)
    thread.start()
    thread.join()
    with pytest.raises(pytest.fail.Exception, match="has no 'Streem'"):
        surface.check()


def test_watched_objects_go_to_the_stand_in_bare() -> None:
    seen: list[Any] = []
    stand_in = Permissive(
        cuda=Permissive(
            Stream=lambda **k: "stream", Event=lambda **k: types.SimpleNamespace(record=seen.append)
        )
    )
    cupy = watched(stand_in, Surface())
    stream = cupy.cuda.Stream()
    assert stream == "stream" and bare(cupy).cuda is stand_in.cuda
    event = cupy.cuda.Event()
    event.record(cupy.cuda.Stream())
    assert seen == ["stream"]


def test_the_fixtures_watch_their_stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from fake_cupy import installed

    for _ in installed(monkeypatch):
        assert type(sys.modules["cupy"]).__name__ == "_Watched"


def test_without_cupy_the_stand_in_is_not_wrapped(monkeypatch: pytest.MonkeyPatch) -> None:
    import cupy_surface

    monkeypatch.setattr(cupy_surface, "REAL", None)
    stand_in = Permissive()
    assert cupy_surface.watched(stand_in, Surface()) is stand_in


def test_signatures_are_read_from_cython_docstrings() -> None:
    def documented() -> None:
        """RawModule(str code=None, *, tuple options=(), name_expressions=None, **kwargs) -> x"""

    shape = signature(types.SimpleNamespace(__doc__=documented.__doc__))
    assert shape is not None
    assert [(p.name, p.kind, p.default is p.empty) for p in shape.parameters.values()] == [
        ("code", inspect.Parameter.POSITIONAL_OR_KEYWORD, False),
        ("options", inspect.Parameter.KEYWORD_ONLY, False),
        ("name_expressions", inspect.Parameter.KEYWORD_ONLY, False),
        ("kwargs", inspect.Parameter.VAR_KEYWORD, True),
    ]
    assert signature(types.SimpleNamespace(__doc__="Not a signature.")) is None
    shape = signature(REAL.cuda.runtime.ipcOpenMemHandle)
    assert shape is not None and list(shape.parameters) == ["handle", "flags"]
    assert [p.annotation for p in shape.parameters.values()] == ["bytes", "unsigned int"]


# The members the stand-ins' arrays add to NumPy's, with the real class of what a property gives
# (the code reads fields of it); "gpu" is the stand-in's own (which GPU a test put the array on).
_PROPERTIES = {"data": "MemoryPointer", "device": "Device"}
_OWN = {"gpu"}


@pytest.mark.parametrize("array_type", [FakeArray, DeviceArray])
def test_the_stand_ins_arrays_have_cupy_s_members(array_type: type) -> None:
    array: np.ndarray = np.arange(4.0).view(array_type)
    members = {n for k in array_type.__mro__[: array_type.__mro__.index(np.ndarray)] for n in vars(k)}
    members = {n for n in members if not n.startswith("_")} - _OWN
    assert members, "no members read"
    for name in sorted(members):
        assert hasattr(REAL.ndarray, name), f"cupy.ndarray has no {name!r}"
        fake = inspect.getattr_static(array_type, name)
        if isinstance(fake, property):
            real_type = getattr(REAL.cuda, _PROPERTIES[name])
            fields = vars(getattr(array, name))
            assert fields and all(hasattr(real_type, f) for f in fields), (name, fields)
        else:
            real = signature(getattr(REAL.ndarray, name))
            assert real is not None
            for parameter in list(inspect.signature(fake).parameters)[1:]:
                assert parameter in real.parameters, f"cupy.ndarray.{name} takes no {parameter!r}"
