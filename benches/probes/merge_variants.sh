#!/usr/bin/env bash
# One device call for the merge kernel's variants: build for sm_90a (MERGE_PROBE=1: the probe
# build), time VARIANTS (benches/probes/merge_variants.py's specs; its default: old staged fine)
# at issue 14's shape in one process, then the GPU merge tests and memcheck of the merge cases
# under the default and under each of TEST_VARIANTS (default: staged), all at once. Logs under
# $OUT, a table last.
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

timeout "${BENCH_S:-90}" python3 -m benches.probes.merge_variants ${VARIANTS:-} \
  >"$out/variants.log" 2>&1
echo "variants rc=$? at $(($(date +%s) - start)) s"

# Every test run at once (correctness only: they share the GPU).
tests=tests/test_merge_topk.py
check() {  # name, environment, pytest arguments...
  local name=$1 vars=$2
  shift 2
  env $vars timeout "${TEST_S:-75}" python3 -m pytest -m gpu -q -n 4 -p no:cacheprovider "$@" \
    >"$out/pytest-$name.log" 2>&1 &
  env $vars timeout "${TEST_S:-75}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m tests.checks.sanitizer merge >"$out/memcheck-$name.log" 2>&1 &
}
check default "" "$tests"
n=0
for variant in ${TEST_VARIANTS:-staged}; do
  n=$((n + 1))
  check "$n" "$(python3 -m benches.probes.merge_variants --env "$variant")" "$tests"
done
wait
for name in default $(seq 1 $n); do
  echo "pytest $name: $(tail -1 "$out/pytest-$name.log")"
  echo "memcheck $name: $(tail -1 "$out/memcheck-$name.log")"
done
echo "test variants: ${TEST_VARIANTS:-staged}"
echo "all: $(($(date +%s) - start)) s"
grep -E "^\|" "$out/variants.log"
