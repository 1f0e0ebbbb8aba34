#!/usr/bin/env bash
# The GPU check in one command, for a machine with CUDA GPUs, CuPy and torch: the GPU tests (the
# loopback's kernels and graphs, bit for bit; the device engine's), bench_gpu.py --quick with its
# JSON (the loopback, the device engine, packets against flags by chunk size, its kernel's
# tunings, a profile of a device call's host part, then the ranks' parts), `stragglar run` on
# NCCL ranks and on the device engine, the DDP example under torchrun on the device engine (the
# hook's rounds engine runs in bench-ranks), the HSDP example on NCCL (FSDP2's all-reduce hook),
# and `stragglar bench` on NCCL ranks; each step logged, and run even when one before it failed;
# a summary at the end.
#
#     bash benchmarks/gpu_check.sh                                # logs and gpu.json in /tmp/stragglar-gpu-check
#     GPU_CHECK_DIR=/data/gpu-check bash benchmarks/gpu_check.sh  # or in the folder it names
#     bash benchmarks/gpu_check.sh device tuning                  # only the steps it names
#
# The limits add up to about 11 minutes. To split the run (a batch job under a 10-minute limit,
# say), run "tests device-tests device packets tuning profile" (the device engine's steps, under
# 5 minutes) first and the others after.
#
# What it writes: device.txt (nvidia-smi's view of the GPUs), one log per step and gpu.json.
# Each step has a time limit (and 10 s more a step to kill one that overran), so that a hung
# step (a rank waiting forever on a peer) cannot hold the machine and the steps after it still
# run. If the machine has no network, put the wheels it lacks (z3-solver,
# ...) in .whl/ and they are installed from there.
# Exits 1 if any step failed, 2 if a step named is not one, the wheels would not install or torch
# sees no CUDA GPU (refused in one line before any step).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
steps=("tests" "device-tests" "loopback" "device" "packets" "tuning" "profile" "bench-ranks" "run-nccl" "run-device" "ddp-device"
    "hsdp" "bench-nccl")
for name in "$@"; do  # a step named wrong would be skipped without a word: refuse it instead
    [[ " ${steps[*]} " == *" $name "* ]] || { echo "gpu_check.sh: no step '$name' (steps: ${steps[*]})" >&2; exit 2; }
done
only=" $* "
out="${GPU_CHECK_DIR:-/tmp/stragglar-gpu-check}"
export PYTHONUNBUFFERED=1
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # an NCCL failure says why in the logs
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/stragglar-site .whl/*.whl || exit 2
    export PYTHONPATH="/tmp/stragglar-site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
# Without a GPU bench_gpu.py says "no GPU" and exits 0 (a run of it there is no failure), so each
# of its steps "passed" and the check exited 0 having checked nothing: refuse before any step, in
# bench_gpu's words.  A check that cannot run (a package missing, or 60 s gone) is said, and the
# steps go on: each says why it fails, and the others still run.
if ! why=$(timeout 60 python3 -c 'import sys; sys.path.insert(0, "benchmarks"); import bench_gpu; sys.exit(bench_gpu.no_gpu())' 2>&1); then
    last="${why##*$'\n'}"
    if [[ "$last" == "no GPU: "* ]]; then
        echo "gpu_check.sh: $last: run it where torch sees a CUDA GPU" >&2
        exit 2
    fi
    echo "gpu_check.sh: could not tell whether a GPU is here ($last); running the steps" >&2
fi
mkdir -p "$out"

failed=0
ran=()  # "name: exit rc (seconds)" per step, for the summary at the end
done_steps=" "  # the names of the steps this run ran: only their logs are summed up
step() {  # step NAME SECONDS COMMAND...: run it with a limit, log it, note a failure, go on
    local name=$1 limit=$2 began=$SECONDS
    shift 2
    [ "$only" = "  " ] || [[ "$only" == *" $name "* ]] || return 0
    echo "===== $name (at most ${limit} s): $*"
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$out/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "===== $name: exit $rc"
    ran+=("$name: exit $rc ($((SECONDS - began)) s)")
    done_steps+="$name "
    [ "$rc" -eq 0 ] || failed=1
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv >"$out/device.txt" 2>&1
# The most telling first: the kernels bit for bit, then the loopback's figures (in a process of
# their own, so that a failure in the ranks' parts cannot take them), then the ranks' parts into
# the same JSON (bench_gpu keeps the loopback's figures there), then the commands a user types.
step tests 25 python3 -m pytest -q -p no:cacheprovider tests/test_runtime_loopback_gpu_device.py tests/test_runtime_loopback_gpu_kernels.py
step device-tests 70 python3 -m pytest -q -p no:cacheprovider tests/test_runtime_device_gpu.py
step loopback 30 python3 benchmarks/bench_gpu.py --quick --iters 3 --progress --parts loopback --json "$out/gpu.json"
step device 60 python3 benchmarks/bench_gpu.py --quick --iters 3 --progress --parts device_executor --json "$out/gpu.json"
step packets 40 python3 benchmarks/bench_gpu.py --iters 3 --progress --parts device_packets --json "$out/gpu.json"
step tuning 55 python3 benchmarks/bench_gpu.py --iters 3 --progress --parts device_tuning --json "$out/gpu.json"
step profile 20 python3 benchmarks/bench_gpu.py --iters 3 --progress --parts device_profile --json "$out/gpu.json"
step bench-ranks 155 python3 benchmarks/bench_gpu.py --quick --iters 3 --parts p2p ddp cupy_nccl --json "$out/gpu.json"
step run-nccl 30 python3 -m stragglar run --backend nccl --gpus 4 --size 16MiB --delay 20ms --chunks 6 --iters 3
step run-device 30 python3 -m stragglar run --backend device --gpus 4 --size 16MiB --delay 20ms --iters 3
step ddp-device 40 torchrun --nproc-per-node=4 examples/ddp_torchrun.py --late-rank 3 --delay 50ms --steps 8 --policy stragglar --engine device
step hsdp 60 torchrun --nproc-per-node=4 examples/hsdp_torchrun.py --late-rank 3 --delay 50ms --steps 8 --policy stragglar
step bench-nccl 30 python3 -m stragglar bench --backend nccl --gpus 2,4 --sizes 1MiB --delays 0,20ms --iters 2
# The end of the output is what a short look sees: each step's exit and time, then the verdicts
# the device engine's parts printed (its targets, exactness, graphs, up to which chunk packets
# beat flags, the fastest tuning, the
# functions the host's part of a call spends most in), the
# DDP example's on it (StragglAR's share, step times, the copies' largest difference) and the
# HSDP example's (whether the losses match, step times), of the steps this run ran.
echo "===== summary (logs and gpu.json in $out)"
printf '  %s\n' "${ran[@]}"
ran_here() { [[ "$done_steps" == *" $1 "* ]]; }  # a log left by an earlier run is not this one's
for name in device packets tuning; do
    ran_here "$name" && grep -h -E \
        "\(target |exact in every row|^graphs|fastest at|as fast as any|NOT exact|no comparison|packet_bytes|not taken" \
        "$out/$name.log"
done
ran_here ddp-device && grep -h -E "^policy |largest difference|DIFFER|median step" "$out/ddp-device.log"
ran_here hsdp && grep -h -E "losses match|losses DIFFER|median step" "$out/hsdp.log"
ran_here profile && grep -h -A5 "^| a whole call" "$out/profile.log"  # the call, then where most goes
exit "$failed"
