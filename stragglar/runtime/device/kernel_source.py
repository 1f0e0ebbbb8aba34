"""The device executor's CUDA C: one persistent kernel per rank runs its whole device program.

Every thread block walks all of its rank's rows (:mod:`~stragglar.runtime.device.table`) over its
own part of each chunk: the ``b``-th of ``B`` near-equal parts, the same on every rank, so a
block's puts and pushes, the flags it raises and the slots and chunks it lands concern its part
only, and the blocks of a rank never wait for each other. Peers are reached by pointer: their
inboxes and flags, and for the direct rows their buffers (``buffers``, every rank's address; a
launch that cannot reach a peer's buffer gives 0 there and runs a program without direct rows). A
``signal`` is a block barrier (every thread's puts and reads are done) and a release store by
thread 0 into the peer's flag of this block; a ``wait`` is thread 0 spinning on an acquire load,
then a block barrier; two data rows in a row have a block barrier between them (their elements may
go to the block's threads differently; two packet rows need none: a thread lands and forwards the
same elements, and each of its packets says itself whether it has come, which each thread polls
for its own). Every spin is bounded: past ``timeout_ns`` of the device's
clock the block claims the rank's error word for this call and writes where it stood (its row, the
round, the peer it waited for, the value it wanted and the one it saw); the rank's other blocks see
the claimed word and stop; the host turns the word into a
:class:`~stragglar.runtime.failures.RankError`. Sums use the loopback's sum types
(:data:`~stragglar.runtime.kernels.SUM_SOURCE`), ``buffer += received`` in the dtype's own
arithmetic, so the results are the interpreter's bits.

The call number (what the flags' values and the error word carry) lives on the device, in the
rank's *progress* words: a kernel's blocks read the last call's number and add one; the last of
them to end (a block that gave up included) counts the call.  So the arguments of a launch never
change, repeated launches and a CUDA graph's replays run call after call with no reset, and the
host, which keeps the count too, can tell a call the device did not count.

The memory-model primitives are the only CUDA-specific code (PTX acquire/release at the GPU's
scope where every rank is on one GPU, at the system's where peers may be on others; the global
timer, atomic claims and counts, the block barriers); compiled for the host with
``STRAGGLAR_HOST`` defined, a prelude maps them to GCC atomics and threads (one host thread per
thread of a block, a real barrier per block), which is how the tests run this very source without
a GPU.

The text is kept apart from the Python that tunes, compiles and launches it
(:mod:`~stragglar.runtime.device.kernel`), with the one layout they share: a rank's words
(:data:`RANK_WORDS`), which the source is formatted with and the host reads after a call.
"""

from __future__ import annotations

from stragglar.runtime.kernels import SUM_SOURCE

__all__ = ["ERROR_WORDS", "PROGRESS_WORDS", "RANK_WORDS", "SOURCE"]

PROGRESS_WORDS = 2  # per rank: the number of the last call its kernel ended, its blocks ended in this one
# per rank: the call that failed, row, round, peer, flag (a packet's: its slot), wanted, seen, block
ERROR_WORDS = 8
RANK_WORDS = PROGRESS_WORDS + ERROR_WORDS  # a rank's words: its progress, then its error


_PRIMITIVES = r"""
#ifndef STRAGGLAR_HOST
// Flags at the scope of the ranks that share them: the GPU's (every rank on one GPU: the L2 orders
// them) or the system's (peers on other GPUs, whose writes cross NVLink or PCIe), which costs a
// fence of the whole system's memory at every release.
__device__ unsigned long long load_acquire(const unsigned long long* word, bool system) {
    unsigned long long value;
    if (system)
        asm volatile("ld.acquire.sys.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    else
        asm volatile("ld.acquire.gpu.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    return value;
}
__device__ void store_release(unsigned long long* word, unsigned long long value, bool system) {
    if (system)
        asm volatile("st.release.sys.u64 [%0], %1;" :: "l"(word), "l"(value) : "memory");
    else
        asm volatile("st.release.gpu.u64 [%0], %1;" :: "l"(word), "l"(value) : "memory");
}
__device__ unsigned long long load_relaxed(const unsigned long long* word) {
    return *(const volatile unsigned long long*)word;
}
// A packet: one 64-bit store and load, which the hardware never splits (data and mark together),
// strong (relaxed, not weak) so that a spinning load sees the store in the end, and ordering
// nothing else, which is what makes it cheaper than a release and an acquire.
__device__ void store_packet(unsigned long long* word, unsigned long long value, bool system) {
    if (system)
        asm volatile("st.relaxed.sys.u64 [%0], %1;" :: "l"(word), "l"(value) : "memory");
    else
        asm volatile("st.relaxed.gpu.u64 [%0], %1;" :: "l"(word), "l"(value) : "memory");
}
__device__ unsigned long long load_packet(const unsigned long long* word, bool system) {
    unsigned long long value;
    if (system)
        asm volatile("ld.relaxed.sys.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    else
        asm volatile("ld.relaxed.gpu.u64 %0, [%1];" : "=l"(value) : "l"(word) : "memory");
    return value;
}
// The call number every thread of the block works for: read by thread 0 from the rank's progress
// word (counted by the last call's last block), shared through the block's memory.
__device__ unsigned long long block_call(const unsigned long long* progress) {
    __shared__ unsigned long long call;
    if (threadIdx.x == 0) call = load_relaxed(progress) + 1;
    __syncthreads();
    return call;
}
__device__ bool claim(unsigned long long* word, unsigned long long call) {
    return atomicMax(word, call) < call;  // the first of this call's blocks to give up
}
__device__ unsigned long long arrive(unsigned long long* word) { return atomicAdd(word, 1ull); }
__device__ unsigned long long now_ns() {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    return now;
}
__device__ void block_barrier() { __syncthreads(); }
__device__ bool block_any(int value) { return __syncthreads_or(value) != 0; }
#ifndef STRAGGLAR_PAUSE_NS
#define STRAGGLAR_PAUSE_NS 64
#endif
__device__ void spin_pause() {
    if (STRAGGLAR_PAUSE_NS > 0) __nanosleep(STRAGGLAR_PAUSE_NS);
}
#define UNROLLED _Pragma("unroll")
#endif
"""

_MOVE = r"""
// Elements lo..hi-1 of from set (or added, Sum's add: to = to + from) into to by the block's
// threads.  Where both sides are at the same offset within 16 bytes, the middle moves 16 bytes a
// load and a store (one element a thread and step would leave most of the memory's width idle),
// VECTORS of them a thread at once: every load is issued before the first store, so that many
// loads are in flight and the memory's latency is paid once for them; the ends go an element at a
// time, and so does every element where the offsets differ.
template <typename Sum, int VECTORS>
__device__ void move(typename Sum::Word* to, const typename Sum::Word* from, long long lo, long long hi,
                     bool add) {
    typedef typename Sum::Word Word;
    const long long width = 16 / sizeof(Word);
    const unsigned long long at = (unsigned long long)(to + lo) % 16;
    long long body = lo, vectors = 0;
    if (width > 1 && at == (unsigned long long)(from + lo) % 16) {
        body = lo + (long long)((16 - at) % 16 / sizeof(Word));
        body = body < hi ? body : hi;
        vectors = (hi - body) / width;
    }
    const long long tail = body + vectors * width;
    for (long long e = lo + threadIdx.x; e < body; e += blockDim.x)
        to[e] = add ? Sum::add(to[e], from[e]) : from[e];
    uint4* to_vectors = reinterpret_cast<uint4*>(to + body);
    const uint4* from_vectors = reinterpret_cast<const uint4*>(from + body);
    const long long stride = blockDim.x;
    for (long long first = threadIdx.x; first < vectors; first += stride * VECTORS) {
        uint4 values[VECTORS], sums[VECTORS];
        UNROLLED
        for (int k = 0; k < VECTORS; ++k) {
            const long long v = first + k * stride;
            if (v < vectors) {
                values[k] = from_vectors[v];
                if (add) sums[k] = to_vectors[v];
            }
        }
        UNROLLED
        for (int k = 0; k < VECTORS; ++k) {
            const long long v = first + k * stride;
            if (v >= vectors) break;
            if (add) {
                Word* words = reinterpret_cast<Word*>(&sums[k]);
                const Word* addends = reinterpret_cast<const Word*>(&values[k]);
                for (long long w = 0; w < width; ++w) words[w] = Sum::add(words[w], addends[w]);
                values[k] = sums[k];
            }
            to_vectors[v] = values[k];
        }
    }
    for (long long e = tail + threadIdx.x; e < hi; e += blockDim.x)
        to[e] = add ? Sum::add(to[e], from[e]) : from[e];
}
"""

_PACKETS = r"""
// Packets (table.py): 8 bytes each, the low 4 data and the high 4 the call's mark (the low 32
// bits of its number).  A thread moves a *unit* at a time: one packet of PER elements (a Word of 4
// bytes or less: a float16's two, a float32's one), or the two packets of one 8-byte element, so
// that the thread that lands an element is the one that sends it on, whatever the row: two packet
// rows in a row need no barrier between them, and a thread forwards what it has landed while the
// block's other threads still wait for theirs.  Unit u of a chunk holds its elements u*PER up to
// (u+1)*PER (a part of a chunk starts at a whole unit, see part_of), at packets u*PACKETS on.
template <typename Word>
struct Packing {
    enum { PER = sizeof(Word) >= 4 ? 1 : 4 / sizeof(Word), PACKETS = sizeof(Word) > 4 ? 2 : 1 };
    union Unit { Word elements[PER]; unsigned int data[PACKETS]; };
};

// Elements lo..hi-1 of a chunk (from: its first element) written as packets marked mark into a slot.
template <typename Word>
__device__ void put_packets(unsigned long long* slot, const Word* from, long long lo, long long hi,
                            unsigned long long mark, bool system) {
    typedef Packing<Word> P;
    for (long long u = lo / P::PER + threadIdx.x; u * P::PER < hi; u += blockDim.x) {
        typename P::Unit unit;
        UNROLLED
        for (int k = 0; k < P::PER; ++k) {
            const long long e = u * P::PER + k;
            unit.elements[k] = e < hi ? from[e] : (Word)0;
        }
        UNROLLED
        for (int k = 0; k < P::PACKETS; ++k)
            store_packet(slot + u * P::PACKETS + k, mark << 32 | unit.data[k], system);
    }
}

// Whether the thread saw packet's mark before its time ran out (or another of the rank's blocks
// gave up: the error word holds this call's number); its data in data.  A thread that gives up
// first claims the rank's error word and writes where it stood.  Every thread of a block may poll
// at once (a flag has one poller a block), so the error word and the clock are read every
// eighth look only: they would otherwise double the loads the polls add to the memory's.
__device__ bool await_packet(const unsigned long long* packet, unsigned long long mark, unsigned int* data,
                             unsigned long long* error, unsigned long long call, long long timeout_ns,
                             bool system, int row, const long long* columns) {
    unsigned long long seen = load_packet(packet, system);
    if (seen >> 32 == mark) {
        *data = (unsigned int)seen;
        return true;
    }
    const unsigned long long start = now_ns();
    for (unsigned looks = 1; (seen = load_packet(packet, system)) >> 32 != mark; ++looks) {
        if (looks % 8 == 0) {
            if (load_relaxed(error) == call) return false;
            if ((long long)(now_ns() - start) > timeout_ns) {
                if (claim(error, call)) {
                    error[1] = row; error[2] = columns[1]; error[3] = columns[2]; error[4] = columns[4];
                    error[5] = mark; error[6] = seen >> 32; error[7] = blockIdx.x;
                }
                return false;
            }
        }
        spin_pause();
    }
    *data = (unsigned int)seen;
    return true;
}

// Elements lo..hi-1 of a chunk (to: its first element) set (or added, Sum's add) from a slot's
// packets once each carries mark; false when the thread gave up waiting.
template <typename Sum>
__device__ bool land_packets(typename Sum::Word* to, const unsigned long long* slot, long long lo,
                             long long hi, bool add, unsigned long long mark, unsigned long long* error,
                             unsigned long long call, long long timeout_ns, bool system, int row,
                             const long long* columns) {
    typedef typename Sum::Word Word;
    typedef Packing<Word> P;
    for (long long u = lo / P::PER + threadIdx.x; u * P::PER < hi; u += blockDim.x) {
        typename P::Unit unit;
        for (int k = 0; k < P::PACKETS; ++k)
            if (!await_packet(slot + u * P::PACKETS + k, mark, &unit.data[k], error, call, timeout_ns, system,
                              row, columns))
                return false;
        UNROLLED
        for (int k = 0; k < P::PER; ++k) {
            const long long e = u * P::PER + k;
            if (e < hi) to[e] = add ? Sum::add(to[e], unit.elements[k]) : unit.elements[k];
        }
    }
    return true;
}

// A block's part of a chunk of size elements: the block-th of blocks near-equal parts, each
// starting at a whole packet unit, the same on every rank whatever the row.
template <typename Word>
__device__ void part_of(long long size, long long block, long long blocks, long long* lo, long long* hi) {
    const long long per = Packing<Word>::PER;
    *lo = size * block / blocks / per * per;
    *hi = block + 1 == blocks ? size : size * (block + 1) / blocks / per * per;
}
"""

_KERNEL = r"""
enum { PUT = 0, SIGNAL = 1, WAIT = 2, COPY = 3, REDUCE = 4, PUSH = 5, PULL = 6, PULL_REDUCE = 7,
       PUT_PACKETS = 8, COPY_PACKETS = 9, REDUCE_PACKETS = 10 };

template <typename Sum, int VECTORS>
__global__ void run_program(const long long* rows, int row_count, int rank, long long count, int num_chunks,
                            long long slot_size, const unsigned long long* buffers,
                            const unsigned long long* inboxes, const unsigned long long* flags,
                            unsigned long long* words, long long timeout_ns, int system) {
    typedef typename Sum::Word Word;
    Word* mine = reinterpret_cast<Word*>(buffers[rank]);
    unsigned long long* progress = words + RANK_WORDS * rank;  // the last call ended, its blocks ended
    unsigned long long* error = progress + PROGRESS_WORDS;
    const long long base = count / num_chunks, extra = count % num_chunks;
    const long long blocks = gridDim.x, block = blockIdx.x;
    const unsigned long long call = block_call(progress);
    const unsigned long long mark = call & 0xffffffffull;  // a packet's mark: the call's low 32 bits
    int moved = 0;  // the last row since the block's last barrier: 0 none, 1 data, 2 packets
    bool gave_up = false;  // this thread stopped waiting for a packet: it moves nothing more
    for (int i = 0; i < row_count; ++i) {
        const long long* row = rows + 8 * i;
        const long long op = row[0], peer = row[2], chunk = row[3], slot = row[4];
        if (op == SIGNAL) {
            // Every thread's puts are done before thread 0 releases them; and a block one of whose
            // threads gave up waiting for a packet (its elements never landed) raises nothing more.
            if (block_any(gave_up)) break;
            moved = 0;
            if (threadIdx.x == 0) {
                unsigned long long* flag = reinterpret_cast<unsigned long long*>(flags[peer]);
                const unsigned long long value = call * (unsigned long long)row[7] + row[6];
                store_release(flag + row[5] * blocks + block, value, system != 0);
            }
            continue;
        }
        if (op == WAIT) {
            int stop = gave_up;
            if (threadIdx.x == 0 && !stop) {
                const unsigned long long* flag = reinterpret_cast<const unsigned long long*>(flags[rank]);
                flag += row[5] * blocks + block;
                const unsigned long long wanted = call * (unsigned long long)row[7] + row[6];
                const unsigned long long start = now_ns();
                unsigned long long seen;
                while ((seen = load_acquire(flag, system != 0)) < wanted) {
                    if (load_relaxed(error) == call) { stop = 1; break; }  // another block gave up
                    if ((long long)(now_ns() - start) > timeout_ns) {
                        if (claim(error, call)) {
                            error[1] = i; error[2] = row[1]; error[3] = peer; error[4] = row[5];
                            error[5] = wanted; error[6] = seen; error[7] = block;
                        }
                        stop = 1;
                        break;
                    }
                    spin_pause();
                }
            }
            // A barrier: after the acquire every thread may read what it made visible; and every
            // thread leaves the rows together when thread 0 (or one that waited for a packet) gave up.
            if (block_any(stop)) break;
            moved = 0;
            continue;
        }
        // Two data rows in a row may give a chunk's elements to the block's threads differently
        // (16-byte vectors where both sides share an offset within 16 bytes, single elements where
        // not: a landing from the inbox, then a push to a peer's buffer at another offset), so a
        // thread could read an element another has not written yet: the barrier makes the rows'
        // order every thread's order, as the prover takes it to be.  Packet rows give every element
        // to the same thread (its unit's), so two of them in a row need none.
        const bool packets = op >= PUT_PACKETS;
        if (moved == 1 || (moved == 2 && !packets)) block_barrier();
        moved = packets ? 2 : 1;
        if (gave_up) continue;  // the thread's own barriers still come: every thread meets them all
        const long long size = base + (chunk < extra ? 1 : 0);
        const long long start = chunk * base + (chunk < extra ? chunk : extra);
        long long lo, hi;
        part_of<Word>(size, block, blocks, &lo, &hi);
        Word* part = mine + start;
        if (packets) {
            const unsigned long long inbox = inboxes[op == PUT_PACKETS ? peer : rank];
            unsigned long long* packet_slot = reinterpret_cast<unsigned long long*>(inbox)
                + slot * (slot_size * (long long)sizeof(Word) / 8);
            if (op == PUT_PACKETS)
                put_packets<Word>(packet_slot, part, lo, hi, mark, system != 0);
            else
                gave_up = !land_packets<Sum>(part, packet_slot, lo, hi, op == REDUCE_PACKETS, mark, error,
                                             call, timeout_ns, system != 0, i, row);
            continue;
        }
        Word* other = op >= PUSH
            ? reinterpret_cast<Word*>(buffers[peer]) + start
            : reinterpret_cast<Word*>(inboxes[op == PUT ? peer : rank]) + slot * slot_size
                  + start % (16 / sizeof(Word));  // the chunk's own offset within 16 bytes
        Word* to = op == PUT || op == PUSH ? other : part;  // element e of the chunk's part, both
        const Word* from = op == PUT || op == PUSH ? part : other;
        move<Sum, VECTORS>(to, from, lo, hi, op == REDUCE || op == PULL_REDUCE);
    }
    // The call is counted once every block has ended (a block that gave up included), by the last
    // to end: the next launch on this rank's stream reads the count, so a launch needs no call
    // number of the host's, and a graph of launches replays as call after call.
    block_barrier();
    if (threadIdx.x == 0 && arrive(progress + 1) == (unsigned long long)(blocks - 1)) {
        progress[1] = 0;
        progress[0] = call;
    }
}
"""

_WORDS = f"#define PROGRESS_WORDS {PROGRESS_WORDS}\n#define RANK_WORDS {RANK_WORDS}\n"

SOURCE = SUM_SOURCE + _PRIMITIVES + _MOVE + _PACKETS + _WORDS + _KERNEL
