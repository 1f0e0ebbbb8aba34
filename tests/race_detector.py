"""The device executor's CUDA source run under ThreadSanitizer: a race detector that watches every
load and store of the kernel's own code, compiled for the host (tests/fake_device.py's prelude: a
thread per rank and block, or per thread of a block with a real barrier among them, flags and
packets as GCC atomics, whose acquire and release it understands).

The prover checks a device program from its rows; this checks what the kernel does with them: a
read of a peer's chunk or an inbox slot, or a write of one, that no flag orders after the access
it conflicts with is a data race, reported whatever the timing of the run.  ThreadSanitizer cannot
watch a library loaded into Python, so the kernel runs in a program of its own (:data:`DRIVER`):
it reads a case (the table, the inboxes' sizes, every rank's input) from a file, runs the calls
with a thread per rank and block (each rank's thread writes its input into a fresh buffer just
before its blocks start, as its caller would in a process of its own), checks every rank's words,
and writes the buffers back.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from fake_device import HOST_PRELUDE

from stragglar.runtime.device.kernel import OWN_TUNING, SOURCE, VECTORS, slot_size
from stragglar.runtime.device.table import DeviceProgram
from stragglar.runtime.kernels import SUMS

DTYPES = ("float16", "float32", "int64")  # words of 2, 4 and 8 bytes: 8, 4 and 2 to a 16-byte move
RACE = 66  # the driver's exit status where ThreadSanitizer reported a race

_DRIVER = r"""
#include <algorithm>
#include <cstdio>
#include <cstdlib>
static long long next_word(FILE* in) {
    long long value;
    if (fread(&value, 8, 1, in) != 1) { fprintf(stderr, "the case ends early\n"); exit(3); }
    return value;
}
template <typename Sum, int VECTORS>
static int run_case(FILE* in, FILE* out, long long n, long long num_chunks, long long count, long long blocks,
                    long long slot, long long flag_count, long long calls, long long threads) {
    typedef typename Sum::Word Word;
    std::vector<std::vector<long long>> rows(n);
    for (auto& r : rows) {
        r.resize(8 * next_word(in));
        if (fread(r.data(), 8, r.size(), in) != r.size()) return 3;
    }
    std::vector<std::vector<Word>> inboxes(n), inputs(n, std::vector<Word>(count + 1)), buffers(n);
    for (auto& inbox : inboxes) inbox.resize(next_word(in) * slot + 1);
    for (auto& input : inputs)
        if (fread(input.data(), sizeof(Word), count, in) != (size_t)count) return 3;
    std::vector<std::vector<unsigned long long>> flags(n);
    for (auto& f : flags) f.resize(flag_count * blocks + 1);
    std::vector<unsigned long long> words(n * RANK_WORDS), buffer_at(n), inbox_at(n), flag_at(n);
    for (long long r = 0; r < n; ++r) {
        inbox_at[r] = (unsigned long long)inboxes[r].data();
        flag_at[r] = (unsigned long long)flags[r].data();
    }
    for (long long call = 1; call <= calls; ++call) {
        for (long long r = 0; r < n; ++r) {
            buffers[r] = std::vector<Word>(count + 1);  // fresh: another address each call
            buffer_at[r] = (unsigned long long)buffers[r].data();
        }
        std::vector<std::thread> ranks;
        for (long long r = 0; r < n; ++r)
            ranks.emplace_back([&, r] {
                // The rank's caller writes its input just before its kernel starts, as a process
                // of its own would: only the rank's own flags tell its peers that it has.
                std::copy(inputs[r].begin(), inputs[r].end(), buffers[r].begin());
                std::vector<std::thread> parts;
                std::vector<std::unique_ptr<Block>> held;  // a block of several threads: its barrier
                for (long long b = 0; b < blocks; ++b) {
                    held.emplace_back(new Block((unsigned)threads));
                    Block* block = threads > 1 ? held.back().get() : nullptr;
                    for (long long t = 0; t < threads; ++t)
                        parts.emplace_back([&, r, b, t, block] {
                            this_block = block;
                            gridDim.x = (unsigned)blocks; blockDim.x = (unsigned)threads;
                            blockIdx.x = (unsigned)b; threadIdx.x = (unsigned)t;
                            run_program<Sum, VECTORS>(rows[r].data(), (int)(rows[r].size() / 8), (int)r,
                                                      count, (int)num_chunks, slot, buffer_at.data(),
                                                      inbox_at.data(), flag_at.data(), words.data(),
                                                      20000000000LL, 1);
                        });
                }
                for (auto& p : parts) p.join();
            });
        for (auto& t : ranks) t.join();
        for (long long r = 0; r < n; ++r) {
            const unsigned long long* mine = words.data() + RANK_WORDS * r;
            if (mine[0] != (unsigned long long)call || mine[PROGRESS_WORDS] == (unsigned long long)call) {
                fprintf(stderr, "rank %lld: call %lld counted as %llu, failed in %llu\n", r, call, mine[0],
                        mine[PROGRESS_WORDS]);
                return 4;
            }
        }
    }
    for (auto& b : buffers) fwrite(b.data(), sizeof(Word), count, out);
    return 0;
}
int main(int argc, char** argv) {
    if (argc != 3) return 2;
    FILE* in = fopen(argv[1], "rb");
    FILE* out = fopen(argv[2], "wb");
    if (!in || !out) return 2;
    long long header[9];
    for (auto& h : header) h = next_word(in);
    const long long kernel = header[0];  // the dtype's index, times 16, plus the vectors
    int status = 2;
    switch (kernel) {
CASES
    }
    fclose(out);
    return status;
}
"""


def driver_source(source: str = SOURCE) -> str:
    """The driver: the host prelude, the kernel's own source (or ``source``, a changed one), and a
    ``main`` that runs a case."""
    arguments = (
        "in, out, header[1], header[2], header[3], header[4], header[5], header[6], header[7], header[8]"
    )
    cases = "".join(
        f"    case {16 * i + v}: status = run_case<{SUMS[d][0]}, {v}>({arguments}); break;\n"
        for i, d in enumerate(DTYPES)
        for v in VECTORS
    )
    return HOST_PRELUDE + source + _DRIVER.replace("CASES", cases)


def build(folder: Path, source: str = SOURCE) -> Path | str:
    """The driver compiled with ThreadSanitizer in ``folder`` (of the kernel's own source, or
    ``source``), or why it could not be."""
    if shutil.which("g++") is None:
        return "needs g++"
    path = folder / "race_driver.cpp"
    path.write_text(driver_source(source))
    binary = folder / "race_driver"
    built = subprocess.run(
        ["g++", "-std=c++14", "-O1", "-g", "-fsanitize=thread", "-pthread", "-o", str(binary), str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if built.returncode != 0:
        return f"g++ -fsanitize=thread failed: {built.stderr.strip().splitlines()[-1:]}"
    return binary


@dataclass(frozen=True)
class Outcome:
    """A run: its exit status (0, :data:`RACE`, or the driver's own failure), what it printed,
    and every rank's buffer after the last call (as words; None unless it ran through)."""

    status: int
    report: str
    buffers: list[np.ndarray] | None


def run(
    binary: Path,
    folder: Path,
    program: DeviceProgram,
    data: list[np.ndarray],
    dtype: str,
    blocks: int,
    calls: int,
    vectors: int = OWN_TUNING.vectors,
    threads: int = 1,
) -> Outcome:
    """``program`` on ``data`` (every rank's input, as words of ``dtype``) with ``blocks`` blocks of
    ``threads`` threads a rank (with a real barrier among a block's threads where more than one)
    moving ``vectors`` 16-byte vectors a thread at once, ``calls`` calls on the same inboxes and
    flags, under the race detector."""
    count = int(data[0].shape[0])
    header = [16 * DTYPES.index(dtype) + vectors, program.num_ranks, program.num_chunks, count, blocks]
    header += [slot_size(count, program.num_chunks, dtype, program.packets), program.flags, calls, threads]
    parts = [np.array(header, dtype=np.int64).tobytes()]
    for rows in program.rows:
        parts += [np.int64(len(rows)).tobytes(), np.ascontiguousarray(rows, dtype=np.int64).tobytes()]
    parts += [np.array(program.inbox_slots, dtype=np.int64).tobytes()]
    parts += [np.ascontiguousarray(d).tobytes() for d in data]
    case, result = folder / "case.bin", folder / "result.bin"
    case.write_bytes(b"".join(parts))
    done = subprocess.run(
        [str(binary), str(case), str(result)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"TSAN_OPTIONS": f"exitcode={RACE} halt_on_error=1 report_signal_unsafe=0"},
    )
    if done.returncode != 0:
        return Outcome(done.returncode, done.stderr, None)
    word = SUMS[dtype][1]
    values = np.frombuffer(result.read_bytes(), dtype=word).reshape(program.num_ranks, count)
    return Outcome(0, done.stderr, [values[r].copy() for r in range(program.num_ranks)])
