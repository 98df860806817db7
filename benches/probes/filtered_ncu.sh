#!/usr/bin/env bash
# Nsight Compute's view of the filtered kernel (benches/NOTES.md "where the queue's pass waits"):
# a release build, then for each case of benches/probes/filtered_ncu.py the second launch of the
# filtered kernel with the throughput, warp-state and scheduler sections. Reports in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/filtered_ncu}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
if [ -z "${SKIP_BUILD:-}" ]; then  # SKIP_BUILD=1: the build installed already (a probe build)
  python3 -m pip install -v --no-build-isolation --no-deps -e . \
    -C build-dir=/tmp/filtered-ncu-build -C cmake.define.JAX_TOPK_CUDA=ON \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
    >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
  echo "built in $(($(date +%s) - start)) s"
fi
# METRICS: a --metrics list instead of the sections; TAG: a suffix of the report names;
# KERNEL: the profiled kernel's name (regex; default the filtered kernel); SOURCE=1 adds the
# instruction statistics and the SASS lines where warps stall most.
sections=(--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats
  --section SchedulerStats --section Occupancy --section ComputeWorkloadAnalysis
  --section LaunchStats)
[ "${SOURCE:-0}" = 1 ] && sections+=(--section InstructionStats --section SourceCounters)
what=("${sections[@]}")
[ -n "${METRICS:-}" ] && what=(--metrics "$METRICS")
for c in ${CASES:-bf16_causal_top_k f32_causal bf16_vocab}; do
  timeout 150 ncu --clock-control none --kernel-name "regex:${KERNEL:-TopkFilteredKernel}" --launch-skip 1 \
    --launch-count 1 "${what[@]}" \
    python3 -m benches.probes.filtered_ncu "$c" >"$out/ncu_$c${TAG:-}.txt" 2>&1
  echo "$c rc=$? at $(($(date +%s) - start)) s"
done
