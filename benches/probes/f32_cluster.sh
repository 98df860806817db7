#!/usr/bin/env bash
# One device call for the float32 cluster kernel (benches/NOTES.md "topk_f32_cluster"): build, the
# whole GPU suite (failures re-run with the kernel off, to tell its failures from others'),
# memcheck on its cases, then device times: before it (off, with jax.lax.top_k), forced on at its
# default cluster size, at 8 blocks a row, topk_f32_rows forced on (its own widths), and the
# build's default rule (VARIANTS: a subset of these names). Phase stamps: f32_cluster_stamps.sh.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/f32_cluster}
mkdir -p "$out/logs"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
python3 -m pip install -v --no-build-isolation --no-deps -e . -C build-dir=/tmp/b \
  -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v" \
  >"$out/logs/build.log" 2>&1 || { tail -50 "$out/logs/build.log"; exit 1; }
grep -A2 "F32Cluster" "$out/logs/build.log" | grep -E "registers|spill" | sort | uniq -c \
  >"$out/logs/ptxas.txt"
echo "built in $(($(date +%s) - start)) s"
timeout ${SUITE_TIMEOUT:-240} python3 -m pytest -m gpu -q -n 10 ${F32_CLUSTER_TESTS:-tests} \
  >"$out/logs/pytest.log" 2>&1
rc=$?
echo "pytest rc=$rc" >>"$out/logs/pytest.log"
tail -4 "$out/logs/pytest.log"
if [[ $rc -ne 0 && $rc -ne 124 ]]; then
  JAX_TOPK_F32_CLUSTER=off timeout 120 python3 -m pytest -m gpu -q -n 10 --lf tests \
    >"$out/logs/pytest_off.log" 2>&1
  echo "failures re-run with the cluster kernel off: rc=$?"; tail -3 "$out/logs/pytest_off.log"
  grep -E "^FAILED|^ERROR" "$out/logs/pytest.log" | head -20
fi
echo "tests done at $(($(date +%s) - start)) s"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m tests.checks.sanitizer \
  f32cluster >"$out/logs/memcheck.log" 2>&1
echo "memcheck rc=$?" | tee -a "$out/logs/memcheck.log"; tail -3 "$out/logs/memcheck.log"
# name:JAX_TOPK_F32_CLUSTER:JAX_TOPK_F32_CLUSTER_PARTS:JAX_TOPK_F32_ROWS
for variant in before:off::: cluster:always::: cluster8:always:8:: rows:::always default::::; do
  IFS=: read -r name mode parts rows _ <<<"$variant"
  if [[ -n ${VARIANTS:-} && " $VARIANTS " != *" $name "* ]]; then continue; fi
  (if [[ -n $mode ]]; then export JAX_TOPK_F32_CLUSTER=$mode; fi
   if [[ -n $parts ]]; then export JAX_TOPK_F32_CLUSTER_PARTS=$parts; fi
   if [[ -n $rows ]]; then export JAX_TOPK_F32_ROWS=$rows; fi
   extra=""; [[ $name == before ]] && extra=--lax
   timeout 100 python3 -m benches.probes.f32_cluster --label "$name" $extra 2>>"$out/logs/bench.err") |
    grep '^{' >>"$out/logs/times.jsonl"
  echo "$name done at $(($(date +%s) - start)) s"
done
tar czf "$out/all.tgz" -C "$out" logs
python3 - "$out/logs/times.jsonl" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
names = [r["variant"] for r in runs]
print(f"{'shape':<40}" + "".join(f"{n:>9}" for n in names))
for shape in runs[0]["us"]:
    print(f"{shape:<40}" + "".join(f"{r['us'].get(shape, float('nan')):9.1f}" for r in runs))
PY
echo "all done at $(($(date +%s) - start)) s"
