#!/usr/bin/env bash
# One device call for the 16-bit filtered-kernel work (benches/NOTES.md "bf16-pass"): a probe build
# (old and new paths behind runtime switches), the packed-compare exhaustive check, the GPU tests
# and memcheck/racecheck on 16-bit rows, then phase stamps and old-vs-new timings. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/filtered_phases}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . -C build-dir=/tmp/bf16pass-build \
  -C cmake.define.JAX_TOPK_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
  -C cmake.define.JAX_TOPK_FILTERED_PROBE=ON -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v" \
  >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
grep -E "registers|spill" "$out/build.log" | sort | uniq -c | sort -rn | head -30 >"$out/ptxas.txt"
echo "built in $(($(date +%s) - start)) s"
nvcc -std=c++17 -arch=sm_90a -I cuda tests/native/packed_threshold_check.cu -o /tmp/ptcheck &&
  /tmp/ptcheck
(
  timeout 75 python3 -m pytest -m gpu -q -n 5 tests/test_top_k.py tests/test_adversarial.py \
    tests/test_contract.py >"$out/pytest.log" 2>&1
  echo "pytest (top_k, adversarial, contract) rc=$?" >>"$out/pytest.log"
) &
(
  timeout 75 python3 -m pytest -m gpu -q -n 5 tests/test_gpu_stress.py \
    -k "16bit or values_match" >"$out/stress.log" 2>&1
  echo "pytest (gpu_stress subset) rc=$?" >>"$out/stress.log"
) &
(
  for tool in memcheck racecheck; do
    timeout 45 compute-sanitizer --tool "$tool" --error-exitcode 9 \
      python3 -m tests.checks.sanitizer filtered16 >"$out/sanitizer-$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?" >>"$out/sanitizer-$tool.log"
  done
) &
wait
for f in pytest stress sanitizer-memcheck sanitizer-racecheck; do tail -3 "$out/$f.log"; done
echo "tests done at $(($(date +%s) - start)) s"
timeout 60 python3 -m benches.probes.filtered_phases --stamps 2>&1 | grep -v "^[WI]0\|^E0" |
  tee "$out/phases.log"
echo "all done at $(($(date +%s) - start)) s"
