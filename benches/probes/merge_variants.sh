#!/usr/bin/env bash
# One device call for the merge kernel's variants: build for sm_90a (MERGE_PROBE=1: the probe
# build), time old / staged / fine (or VARIANTS) at issue 14's shape in one process (each
# checked bit for bit against the CPU), then the GPU merge tests under the default (fine) and,
# for the register kernel, under staged, and memcheck of the merge cases, side by side. Logs
# under $OUT.
# From the repo root: bash benches/probes/merge_variants.sh
set -uo pipefail
out=${OUT:-/tmp/merge_variants}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . \
  -C cmake.define.JAX_TOPK_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v ${MERGE_PROBE:+-DJAX_TOPK_MERGE_PROBE=1}" \
  >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - start)) s"
grep -A2 "MergeInRegistersKernel.*for 'sm_90a'" "$out/build.log" | grep -E "registers|spill" | sort -u

# VARIANTS: the probe's arguments (its default: old staged fine); phase stops (fine@N) need
# MERGE_PROBE=1 (a probe build).
timeout "${BENCH_S:-90}" python3 -m benches.probes.merge_variants ${VARIANTS:-} \
  >"$out/variants.log" 2>&1
echo "variants rc=$? at $(($(date +%s) - start)) s"

tests=tests/test_merge_topk.py
timeout "${TEST_S:-75}" python3 -m pytest -m gpu -q -n 6 -p no:cacheprovider "$tests" \
  >"$out/pytest-fine.log" 2>&1 &
JAX_TOPK_MERGE_VARIANT=staged timeout "${TEST_S:-75}" python3 -m pytest -m gpu -q -n 4 \
  -p no:cacheprovider -k "register_kernel or fine_bucket or sorted_lists" "$tests" \
  >"$out/pytest-staged.log" 2>&1 &
timeout "${TEST_S:-75}" compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m tests.checks.sanitizer merge >"$out/memcheck.log" 2>&1
echo "memcheck rc=$?: $(tail -1 "$out/memcheck.log")"
wait
echo "pytest fine: $(tail -1 "$out/pytest-fine.log")"
echo "pytest staged: $(tail -1 "$out/pytest-staged.log")"
echo "all: $(($(date +%s) - start)) s"
grep -E "^\|" "$out/variants.log"
