"""The device executor's CUDA source without a GPU: compiled to PTX by NVRTC as CuPy compiles it,
and for the host with g++ (tests/fake_device.py: a host thread per rank and block, flags as
atomics), where it runs every schedule's proved program exactly as the interpreter does, bit for
bit, staged through the inboxes and with direct transfers, call after call without a reset; a
rank that never comes makes the others' waits time out with an error word naming the rank, the
round and the peer; a program whose flag values are off makes it time out rather than sum
wrongly."""

from __future__ import annotations

import ctypes
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from fake_device import H200, HostRun, host_or_skip
from nvrtc import CUPY_ADDS, assemble, compile_ptx, library, ptxas

from stragglar.runtime.device.kernel import OWN_TUNING, PAUSES_NS, SOURCE, THREADS, VECTORS, kernel_name
from stragglar.runtime.device.loopback import resident_blocks
from stragglar.runtime.device.lowering import lower
from stragglar.runtime.device.prover import check
from stragglar.runtime.device.table import WAIT, DeviceProgram
from stragglar.runtime.kernels import SUMS
from stragglar.runtime.local import run_local
from stragglar.runtime.plans import plan_for
from stragglar.runtime.program import compile_schedule
from stragglar.schedule import Schedule
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove

DTYPES = list(SUMS)
EVERY_SCHEDULE = [(a, n) for a in ALGORITHMS for n in range(2, 18) if a != "rhd" or not n & (n - 1)]
CHUNKED = [(4, 32), (5, 9), (8, 64), (16, 40)]


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    return host_or_skip(tmp_path_factory)


def inputs(n: int, count: int, dtype: str, seed: int) -> list[np.ndarray]:
    """Distinct values per rank and element whose sums round (floats from a normal draw), so a
    change in the order of additions shows; integers over a wide range."""
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return [rng.integers(-(2**20), 2**20, count).astype(dtype) for _ in range(n)]
    if dtype == "bfloat16":  # NumPy has none: float32 values rounded to bfloat16, held as float32
        return [_as_bfloat16(rng.standard_normal(count).astype(np.float32)) for _ in range(n)]
    return [rng.standard_normal(count).astype(dtype) for _ in range(n)]


def _as_bfloat16(values: np.ndarray) -> np.ndarray:
    torch = pytest.importorskip("torch")
    rounded: np.ndarray = torch.from_numpy(values).to(torch.bfloat16).to(torch.float32).numpy()
    return rounded


def words(values: np.ndarray, dtype: str) -> np.ndarray:
    """The elements as the kernel's words (bfloat16: the top half of each float32)."""
    if dtype == "bfloat16":
        top: np.ndarray = (values.view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        return top
    held: np.ndarray = values.view(SUMS[dtype][1])
    return held


def interpreted(schedule: Schedule, data: list[np.ndarray], dtype: str) -> list[np.ndarray]:
    """The interpreter's result, as words: NumPy arrays, torch tensors for bfloat16."""
    proof = prove(schedule)
    count = data[0].shape[0]
    plans = [plan_for(proof, r, count) for r in range(schedule.num_ranks)]
    if dtype == "bfloat16":
        torch = pytest.importorskip("torch")
        tensors = [torch.from_numpy(d.copy()).to(torch.bfloat16) for d in data]
        run_local(tensors, plans)
        return [t.view(torch.int16).numpy().view(np.uint16) for t in tensors]
    copies = [d.copy() for d in data]
    run_local(copies, plans)
    return [words(c, dtype) for c in copies]


def run_on_host(
    host: ctypes.CDLL,
    program: DeviceProgram,
    data: list[np.ndarray],
    dtype: str,
    blocks: int,
    calls: int = 1,
    offsets: bool = False,
    vectors: int = OWN_TUNING.vectors,
    threads: int = 1,
) -> list[np.ndarray]:
    """The program run ``calls`` times on fresh copies of ``data`` (the same inboxes and flags,
    never reset); the last call's buffers, as words.  ``offsets``: rank r's buffer starts r % 3
    elements into its memory, so that two ranks' chunks sit at different offsets within 16 bytes;
    ``vectors``: the kernel's 16-byte vectors a thread at once; ``threads``: a block's."""
    run = HostRun(host, program, data[0].shape[0], dtype, blocks, vectors, threads)
    buffers: list[np.ndarray] = []
    for _ in range(calls):
        buffers = [_placed(words(d, dtype), r % 3 if offsets else 0) for r, d in enumerate(data)]
        errors = run.call(buffers)
        assert not errors[:, 0].any(), errors
    return buffers


def _placed(values: np.ndarray, offset: int) -> np.ndarray:
    """A copy of ``values`` starting ``offset`` elements into memory aligned to 64 bytes."""
    memory = np.empty(values.nbytes + (offset + 8) * values.itemsize + 64, dtype=np.uint8)
    start = -memory.ctypes.data % 64 + offset * values.itemsize
    placed: np.ndarray = memory[start : start + values.nbytes].view(values.dtype)
    placed[:] = values
    return placed


def same(
    schedule: Schedule,
    host: ctypes.CDLL,
    dtype: str,
    count: int,
    blocks: int,
    calls: int = 1,
    direct: bool = False,
    offsets: bool = False,
    vectors: int = OWN_TUNING.vectors,
    threads: int = 1,
    packets: bool = False,
) -> None:
    data = inputs(schedule.num_ranks, count, dtype, seed=count + schedule.num_ranks)
    want = interpreted(schedule, data, dtype)
    program = lower(compile_schedule(schedule), direct, packets)
    check(program)
    got = run_on_host(host, program, data, dtype, blocks, calls, offsets, vectors, threads)
    for rank, (w, g) in enumerate(zip(want, got, strict=True)):
        assert w.tobytes() == g.tobytes(), (
            schedule.algorithm,
            schedule.num_ranks,
            dtype,
            count,
            blocks,
            rank,
            direct,
            vectors,
            packets,
        )


@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
@pytest.mark.parametrize(("index", "algorithm", "n"), [(i, *s) for i, s in enumerate(EVERY_SCHEDULE)])
def test_every_schedule_runs_exactly_as_the_interpreter(
    host: ctypes.CDLL, index: int, algorithm: str, n: int, direct: bool
) -> None:
    """Every algorithm at N = 2..17, the dtypes and the kernel's vector counts taken in turn;
    uneven chunks, 1..3 blocks."""
    dtype = DTYPES[index % len(DTYPES)]
    vectors = VECTORS[index % len(VECTORS)]
    count = 5 * n + 3
    same(synthesize(algorithm, n), host, dtype, count, blocks=1 + index % 3, direct=direct, vectors=vectors)


@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "chunks"), CHUNKED)
def test_chunked_schedules_in_every_dtype_are_exact(
    host: ctypes.CDLL, dtype: str, n: int, chunks: int, direct: bool
) -> None:
    same(
        synthesize("stragglar", n, chunks=chunks), host, dtype, count=3 * chunks + 1, blocks=2, direct=direct
    )


@pytest.mark.parametrize("vectors", VECTORS)
@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
@pytest.mark.parametrize("offsets", [False, True], ids=["aligned", "offset"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sixteen_byte_moves_and_the_elements_around_them(
    host: ctypes.CDLL, dtype: str, offsets: bool, direct: bool, vectors: int
) -> None:
    """Parts long enough for the 16-byte moves, with heads and tails of single elements around
    them; buffers at different offsets within 16 bytes, where chunks move an element at a time;
    each of the kernel's vector counts (a block's 16-byte vectors are no whole number of a
    thread's groups of them, so the last group is cut short)."""
    same(
        synthesize("stragglar", 5, chunks=6),
        host,
        dtype,
        6 * 203 + 5,
        blocks=3,
        direct=direct,
        offsets=offsets,
        vectors=vectors,
    )


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_block_s_threads_keep_the_rows_order_where_buffers_sit_at_other_offsets(
    host: ctypes.CDLL, dtype: str
) -> None:
    """Several threads a block: a landing from the inbox moves 16-byte vectors, a push of the same
    chunk to a peer's buffer at another offset within 16 bytes moves single elements, which go to
    other threads.  Without a barrier between the two rows a thread sent elements another had not
    landed yet, and most ranks ended with wrong sums: this test, 4 threads a block, failed so
    before the kernel had that barrier (found by reading the kernel, not yet run on a GPU)."""
    same(
        synthesize("stragglar", 8, chunks=16),
        host,
        dtype,
        16 * 1001 + 3,
        blocks=2,
        direct=True,
        offsets=True,
        threads=4,
    )


@pytest.mark.parametrize("count", [0, 1, 3, 7])
def test_empty_chunks_and_more_blocks_than_elements(host: ctypes.CDLL, count: int) -> None:
    same(synthesize("stragglar", 5, chunks=8), host, "float32", count, blocks=4)


@pytest.mark.parametrize("direct", [False, True], ids=["staged", "direct"])
def test_repeated_calls_need_no_reset(host: ctypes.CDLL, direct: bool) -> None:
    """Calls 1, 2, 3 on the same flags and inboxes: the flags' values carry the call number."""
    same(synthesize("stragglar", 6), host, "float64", count=40, blocks=2, calls=3, direct=direct)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_schedule_in_every_dtype(host: ctypes.CDLL, dtype: str) -> None:
    for algorithm, n in EVERY_SCHEDULE:
        for direct in (False, True):
            same(synthesize(algorithm, n), host, dtype, count=2 * n + 1, blocks=2, direct=direct)


def test_a_rank_that_never_comes_times_out_the_others_naming_it(host: ctypes.CDLL) -> None:
    schedule = synthesize("stragglar", 5)
    program = lower(compile_schedule(schedule))
    run = HostRun(host, program, 30, "float32", 2)
    data = [words(d, "float32").copy() for d in inputs(5, 30, "float32", 1)]
    errors = run.call(data, timeout_s=0.3, absent=[4])
    failed = [r for r in range(5) if errors[r, 0]]
    assert failed and 4 not in failed
    blamed = [r for r in failed if errors[r, 3] == 4]
    assert blamed, errors
    for rank in blamed:
        row = int(errors[rank, 1])
        assert program.rows[rank][row, 0] == WAIT and program.rows[rank][row, 2] == 4
        assert errors[rank, 2] == program.rows[rank][row, 1]  # the row's round
        assert errors[rank, 6] < errors[rank, 5]  # it saw less than it wanted


def test_a_flag_value_off_by_one_times_out_instead_of_summing_wrongly(host: ctypes.CDLL) -> None:
    program = lower(compile_schedule(synthesize("ring", 4)))
    rows = [r.copy() for r in program.rows]
    index = int(np.flatnonzero(rows[1][:, 0] == WAIT)[0])
    rows[1][index, 6] = rows[1][index, 7] + 1  # one more than the peer's last value of the call
    wrong = dataclasses.replace(program, rows=tuple(rows))
    run = HostRun(host, wrong, 16, "int32", 1)
    errors = run.call([words(d, "int32").copy() for d in inputs(4, 16, "int32", 2)], timeout_s=0.3)
    assert errors[1, 0] == 1 and errors[1, 1] == index and errors[1, 3] == program.rows[1][index, 2]


def test_the_source_compiles_for_a_gpu_with_nvrtc() -> None:
    nvrtc = library()
    if nvrtc is None:
        pytest.skip("needs the nvidia-cuda-nvrtc wheel")
    names = [kernel_name(dtype, vectors) for dtype in DTYPES for vectors in VECTORS]
    result = compile_ptx(nvrtc, SOURCE, names, ["--std=c++14", "-arch=compute_90", *CUPY_ADDS])
    assert set(result.lowered) == set(names) and all(result.lowered.values())
    for instruction in (
        "ld.acquire.sys.u64",
        "st.release.sys.u64",
        "ld.acquire.gpu.u64",
        "st.release.gpu.u64",
        "ld.relaxed.sys.u64",
        "st.relaxed.sys.u64",
        "ld.relaxed.gpu.u64",
        "st.relaxed.gpu.u64",
        "%globaltimer",
        "atom.global.max.u64",
        "atom.global.add.u64",
        "bar.red.or",
    ):
        assert instruction in result.ptx, instruction
    adds = re.findall(r"\badd(?:\.[a-z0-9]+)*\.f32\b", result.ptx)
    assert adds and not [a for a in adds if ".ftz" in a], adds  # CuPy's -ftz=true flushes no sum


def test_a_thread_issues_all_its_vectors_loads_before_its_first_store() -> None:
    """What ``vectors`` is for: in the PTX of each vector count, a thread's group of 16-byte moves
    is ``vectors`` loads of the source and as many of the target (a reduction's), all before the
    group's first store, so that they are in flight together."""
    nvrtc = library()
    if nvrtc is None:
        pytest.skip("needs the nvidia-cuda-nvrtc wheel")
    for vectors in VECTORS:
        name = kernel_name("float32", vectors)
        ptx = compile_ptx(nvrtc, SOURCE, [name], ["--std=c++14", "-arch=compute_90", *CUPY_ADDS]).ptx
        moves = [
            line.split()[0][:5] for line in ptx.splitlines() if line.strip().startswith(("ld.v4", "st.v4"))
        ]
        assert moves == ["ld.v4"] * (2 * vectors) + ["st.v4"] * vectors, moves


@pytest.mark.parametrize("pause_ns", PAUSES_NS)
def test_a_waiting_thread_sleeps_between_looks_only_where_its_tuning_pauses(pause_ns: int) -> None:
    """The pause is the compile option the engine passes (``compile_kernel``): at 0 the spin loops
    hold no sleep, else one each (a flag's and a packet's)."""
    nvrtc = library()
    if nvrtc is None:
        pytest.skip("needs the nvidia-cuda-nvrtc wheel")
    name = kernel_name("float32")
    options = ["--std=c++14", "-arch=compute_90", f"-DSTRAGGLAR_PAUSE_NS={pause_ns}", *CUPY_ADDS]
    ptx = compile_ptx(nvrtc, SOURCE, [name], options).ptx
    assert ptx.count("nanosleep.u32") == (0 if pause_ns == 0 else 2)


def test_every_kernel_fits_a_block_of_threads_on_hopper_without_spilling(tmp_path: Path) -> None:
    """A block launches only where its threads' registers fit a multiprocessor's 64K (the engine
    refuses, before launch, a launch the GPU cannot hold): each kernel, every dtype and vector
    count, assembled by ptxas for Hopper (sm_90), fits the most :data:`THREADS` without spilling
    registers to memory (which would slow every move); and with its registers the engine's own
    tuning, in every dtype, gives each of 16 ranks 16 blocks at once on an H200."""
    nvrtc, assembler = library(), ptxas()
    if nvrtc is None or assembler is None:
        pytest.skip("needs the nvidia-cuda-nvrtc and nvidia-cuda-nvcc wheels")
    names = [kernel_name(dtype, vectors) for dtype in DTYPES for vectors in VECTORS]
    compiled = compile_ptx(nvrtc, SOURCE, names, ["--std=c++14", "-arch=compute_90", *CUPY_ADDS])
    assembled = assemble(assembler, compiled.ptx, "sm_90", tmp_path)
    for name in names:
        kernel = assembled[compiled.lowered[name]]
        assert kernel.registers * max(THREADS) <= H200["regsPerMultiprocessor"] and kernel.spilled == 0, (
            name,
            kernel,
        )
    for dtype in DTYPES:
        own = assembled[compiled.lowered[kernel_name(dtype)]]
        resident = resident_blocks(H200, own.registers, own.shared, OWN_TUNING.threads)
        assert resident >= 16 * 16, (dtype, own, resident)  # 16 ranks, 16 blocks each
