#!/usr/bin/env bash
# One device call for filtered-kernel work (benches/NOTES.md "bf16-pass", "bf16-bin0", "queue
# lead"): a probe build (old and new paths behind runtime switches), the GPU tests of top_k, the
# value families, the contract and the stress file (TESTS: others), memcheck on 16-bit rows, then
# the new families' route counts, phase stamps and old-vs-new timings. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/filtered_phases}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . -C build-dir=/tmp/filtered-probe-build \
  -C cmake.define.JAX_TOPK_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  -C cmake.define.JAX_TOPK_FILTERED_PROBE=ON -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v" \
  >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
grep -E "registers|spill" "$out/build.log" | sort | uniq -c | sort -rn | head -30 >"$out/ptxas.txt"
echo "built in $(($(date +%s) - start)) s"
(
  # shellcheck disable=SC2086
  timeout "${TEST_LIMIT_S:-110}" python3 -m pytest -m gpu -q -n 10 -p no:cacheprovider \
    ${TESTS:-tests/test_top_k.py tests/test_adversarial.py tests/test_contract.py tests/test_gpu_stress.py} \
    >"$out/pytest.log" 2>&1
  echo "pytest (${TESTS:-top_k, adversarial, contract, gpu_stress}) rc=$?" >>"$out/pytest.log"
) &
(
  timeout "${TEST_LIMIT_S:-110}" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m tests.checks.sanitizer filtered16 >"$out/sanitizer-memcheck.log" 2>&1
  echo "compute-sanitizer memcheck rc=$?" >>"$out/sanitizer-memcheck.log"
) &
wait
for f in pytest sanitizer-memcheck; do tail -4 "$out/$f.log"; done
echo "tests done at $(($(date +%s) - start)) s"
timeout "${PHASES_LIMIT_S:-90}" python3 -m benches.probes.filtered_phases ${PHASES_ARGS---routes --stamps} 2>&1 |
  grep -v "^[WI]0\|^E0" | tee "$out/phases.log"
echo "all done at $(($(date +%s) - start)) s"
