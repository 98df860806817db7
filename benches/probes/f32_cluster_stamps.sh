#!/usr/bin/env bash
# One device call (benches/NOTES.md "topk_f32_cluster, by phase"): the stamps probe built with
# stamps and clean (for the graph timings) for each variant, run, and the first variant's clean
# build under ncu for each launch's duration (NCU=0 skips it). Needs nvcc and the CUDA toolkit's
# CCCL only; no JAX, no install.
#   VARIANTS="name:-DFLAG=1 -DOTHER=2;name2:..." (default: one variant, the library's build)
#   (a variant's flags come first, so "base:-I/tmp/base/cuda" builds another tree's kernel; a
#   header missing from that tree falls back to this one's, silently)
#   ROUNDS=n  after that, the clean binaries n more times each, in the order A B .. B A per
#   round (a drift of the GPU hits every variant alike), and a table of the median and range of
#   each shape's us a launch by variant (rounds.md); the comparisons of 2026-12-06 used ROUNDS=4
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/f32_cluster_stamps}
mkdir -p "$out"
IFS=';' read -ra variants <<<"${VARIANTS:-library:}"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icuda)
for variant in "${variants[@]}"; do
  name=${variant%%:*}
  read -ra extra <<<"${variant#*:}"
  for stamps in 0 1; do
    nvcc "${extra[@]}" "${flags[@]}" -DJAX_TOPK_F32_CLUSTER_STAMPS=$stamps \
      benches/probes/f32_cluster_stamps.cu -o "/tmp/f32_stamps_${name}_$stamps" \
      2>"$out/build-$name-$stamps.log" &
  done
done
wait
for variant in "${variants[@]}"; do
  name=${variant%%:*}
  echo "== $name: clean (graph timings, empty kernels)"
  "/tmp/f32_stamps_${name}_0" | tee "$out/clean-$name.txt"
  echo "== $name: stamps"
  "/tmp/f32_stamps_${name}_1" | tee "$out/stamps-$name.txt"
done
if [[ ${ROUNDS:-0} -gt 0 ]]; then
  names=()
  for variant in "${variants[@]}"; do names+=("${variant%%:*}"); done
  order=("${names[@]}")
  for ((i = ${#names[@]} - 1; i >= 0; i--)); do order+=("${names[$i]}"); done
  for ((round = 0; round < ROUNDS; round++)); do
    for name in "${order[@]}"; do
      "/tmp/f32_stamps_${name}_0" | grep -v "^empty" >>"$out/rounds-$name.txt"
    done
  done
  specs=()
  for name in "${names[@]}"; do specs+=("$name=$out/rounds-$name.txt"); done
  python3 -m benches.probes.variant_table --name-width 22 "${specs[@]}" | tee "$out/rounds.md"
fi
[ "${NCU:-1}" = 0 ] && exit 0
first=${variants[0]%%:*}
echo "== ncu durations ($first)"
ncu --metrics gpu__time_duration.sum --csv "/tmp/f32_stamps_${first}_0" --ncu >"$out/ncu.csv" \
  2>"$out/ncu.err"
python3 - "$out/ncu.csv" <<'PY'
import csv, sys
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name, unit, value = (head.index(c) for c in ("Kernel Name", "Metric Unit", "Metric Value"))
for r in rows[1:]:
    print(f"{r[name][:70]:<70} {r[value]:>10} {r[unit]}")
PY
