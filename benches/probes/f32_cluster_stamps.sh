#!/usr/bin/env bash
# One device call (benches/NOTES.md "topk_f32_cluster, by phase"): the stamps probe built twice
# (with stamps, and clean for the graph timings), run, and the clean one under ncu for each
# launch's duration. Needs nvcc and the CUDA toolkit's CCCL only; no JAX, no install.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/f32_cluster_stamps}
mkdir -p "$out"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icuda
       ${STAMPS_FLAGS:-})
nvcc "${flags[@]}" -DJAX_TOPK_F32_CLUSTER_STAMPS=1 benches/probes/f32_cluster_stamps.cu \
  -o /tmp/f32_stamps 2>"$out/build-stamps.log" &
nvcc "${flags[@]}" -DJAX_TOPK_F32_CLUSTER_STAMPS=0 benches/probes/f32_cluster_stamps.cu \
  -o /tmp/f32_clean 2>"$out/build-clean.log" &
wait
echo "== clean (graph timings, empty kernels)"; /tmp/f32_clean | tee "$out/clean.txt"
echo "== stamps"; /tmp/f32_stamps | tee "$out/stamps.txt"
echo "== ncu durations"
ncu --metrics gpu__time_duration.sum --csv /tmp/f32_clean --ncu >"$out/ncu.csv" 2>"$out/ncu.err"
python3 - "$out/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name, unit, value = (head.index(c) for c in ("Kernel Name", "Metric Unit", "Metric Value"))
for r in rows[1:]:
    print(f"{r[name][:70]:<70} {r[value]:>10} {r[unit]}")
PY
