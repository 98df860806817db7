#!/usr/bin/env bash
# One device call on a release build for sm_90a (kept on a warm machine: only changed units
# rebuild), each step optional, logs and results under $OUT. From the repo root.
#   TESTS            pytest paths run with -m gpu (default: tests; "" for none)
#   SANITIZER_MODES  tests.checks.sanitizer modes under memcheck, beside the tests ("all": the
#                    default mode; default: none)
#   PROBES           benches.probes modules run after the tests (their tables printed)
#   EXTRA_CUDA_FLAGS nvcc flags added to the build's (a kernel's probe switches: -DNAME=1)
#   BENCH_RUNS       `python -m benches.bench` argument sets, separated by ';', each merged into
#                    benches/results/h200.* and copied to $OUT after it (under BENCH_S each)
# This session's calls (benches/NOTES.md "split or queue"): SANITIZER_MODES="filtered16 all"
# PROBES=split_or_queue; then TESTS="tests/test_gpu_stress.py tests/test_top_k.py"
# PROBES=split_or_queue BENCH_RUNS="--ops topk_bf16,topk_filtered,top_k,merge_topk"; then
# TESTS= BENCH_RUNS="--ops indexer_logits,indexer_topk --shapes
# 1x131072,32x131072,128x65536,512x65536,2048x32768;--ops indexer_logits,indexer_topk --shapes
# 4096x131072 --skip-check".
set -uo pipefail
out=${OUT:-/tmp/release_run}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . -C build-dir=/tmp/release-build \
  -C cmake.define.JAX_TOPK_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v ${EXTRA_CUDA_FLAGS:-}" >"$out/build.log" 2>&1 \
  || { tail -40 "$out/build.log"; exit 1; }
echo "build: $(($(date +%s) - start)) s"
tests=${TESTS-tests}
if [[ -n $tests ]]; then
  (
    # shellcheck disable=SC2086
    timeout "${TEST_S:-300}" python3 -m pytest -m gpu -q -n 10 -p no:cacheprovider $tests \
      >"$out/pytest.log" 2>&1
    echo "pytest rc=$?" >>"$out/pytest.log"
  ) &
fi
for mode in ${SANITIZER_MODES:-}; do
  (
    arg=$mode
    [[ $mode == all ]] && arg=
    # shellcheck disable=SC2086
    timeout "${TEST_S:-300}" compute-sanitizer --tool memcheck --error-exitcode 9 \
      python3 -m tests.checks.sanitizer $arg >"$out/memcheck-$mode.log" 2>&1
    echo "memcheck $mode rc=$?" >>"$out/memcheck-$mode.log"
  ) &
done
wait
[[ -n $tests ]] && tail -2 "$out/pytest.log" && grep -E "^FAILED" "$out/pytest.log" | head -20
for mode in ${SANITIZER_MODES:-}; do tail -2 "$out/memcheck-$mode.log"; done
echo "tests: $(($(date +%s) - start)) s"
for probe in ${PROBES:-}; do
  timeout "${PROBE_S:-150}" python3 -m "benches.probes.$probe" 2>&1 | grep -v "^[WIE]0" \
    | tee "$out/$probe.md"
done
IFS=';' read -ra runs <<<"${BENCH_RUNS:-}"
for i in "${!runs[@]}"; do
  # shellcheck disable=SC2086
  timeout "${BENCH_S:-420}" python3 -m benches.bench ${runs[$i]} \
    --json benches/results/h200.json --merge --report >"$out/bench-$i.log" 2>&1
  echo "bench ${runs[$i]}: rc=$? at $(($(date +%s) - start)) s"
  grep "^| [a-z_]* |" "$out/bench-$i.log" | tail -20
  cp benches/results/h200.json benches/results/h200.md benches/results/h200.png "$out/"
done
echo "all: $(($(date +%s) - start)) s"
