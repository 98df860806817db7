#!/usr/bin/env bash
# One device call for the float32 register kernel (benches/NOTES.md "topk_f32_rows"): build, the
# GPU tests that reach it (and the filtered kernel's short float32 rows with it switched off),
# memcheck, then device times with it off / on at its default row limit / on for every row count.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/f32_rows}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . -C build-dir=/tmp/f32rows-build \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v" \
  >"$out/build.log" 2>&1 || { tail -50 "$out/build.log"; exit 1; }
grep -A2 "F32Rows" "$out/build.log" | grep -E "registers|spill" | sort | uniq -c >"$out/ptxas.txt"
echo "built in $(($(date +%s) - start)) s"
timeout 200 python3 -m pytest -m gpu -q -x -n 8 ${F32_ROWS_TESTS:-tests/test_f32_rows.py \
  tests/test_gpu_stress.py tests/test_top_k.py tests/test_contract.py tests/test_adversarial.py} \
  >"$out/pytest.log" 2>&1
echo "pytest rc=$?" >>"$out/pytest.log"
tail -5 "$out/pytest.log"
echo "tests done at $(($(date +%s) - start)) s"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m tests.checks.sanitizer \
  f32rows >"$out/memcheck.log" 2>&1
echo "memcheck rc=$?" | tee -a "$out/memcheck.log"
for variant in filtered:off default: register:always; do
  name=${variant%%:*} mode=${variant#*:}
  (if [[ -n $mode ]]; then export JAX_TOPK_F32_ROWS=$mode; fi
   timeout 90 python3 -m benches.probes.f32_rows --label "$name" 2>>"$out/bench.err") |
    grep '^{' >>"$out/times.jsonl"
done
python3 - "$out/times.jsonl" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
names = [r["variant"] for r in runs]
print(f"{'shape':<40}" + "".join(f"{n:>12}" for n in names))
for shape in runs[0]["us"]:
    print(f"{shape:<40}" + "".join(f"{r['us'].get(shape, float('nan')):12.1f}" for r in runs))
PY
echo "all done at $(($(date +%s) - start)) s"
