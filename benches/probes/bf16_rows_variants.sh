#!/usr/bin/env bash
# One device call (benches/NOTES.md "topk_bf16: walks by every warp, a guarded second pass"):
# bf16_rows_variants.cu built once per variant, each run twice in turn (A B C A B C) so that a
# drift of the GPU shows (the CPU handler's topk_cpu.cc linked in as the reference). Needs nvcc
# and the toolkit's CCCL only; changes nothing in the tree. Ends on a table of each shape's
# median and range over both rounds, a column a variant ($OUT/table.md).
#   VARIANTS="name:flags;name2:flags" (default: the tree's kernel, and its build with phase stamps,
#   -DJAX_TOPK_BF16_STAMPS=1, whose times carry the stamps' stores). A variant's flags come
#   first, so "-I dir" builds dir/kernels/topk_bf16.cu (its other headers from this tree), and
#   "-I @patched" the tree's kernel with the diff PATCH applied (a `git diff` of
#   cuda/kernels/topk_bf16.cu, applied to a copy under /tmp: the word @patched stands for it).
set -uo pipefail
[[ -n ${PATCH:-} ]] && PATCH=$(realpath "$PATCH")
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/bf16_rows_variants}
bin=$(mktemp -d /tmp/bf16_rows_bin.XXXXXX)
patched=$(mktemp -d /tmp/bf16_rows_patched.XXXXXX)
trap 'rm -rf "$bin" "$patched"' EXIT
mkdir -p "$out"
if [[ -n ${PATCH:-} ]]; then
  mkdir -p "$patched/kernels"
  cp cuda/kernels/topk_bf16.cu "$patched/kernels/"
  patch -s -p2 -d "$patched" <"$PATCH" || exit 1
fi
default="tree:;stamps:-DJAX_TOPK_BF16_STAMPS=1"
IFS=';' read -ra variants <<<"${VARIANTS:-$default}"
flags=(-O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icuda
  -Xptxas=-v)
pids=()
for variant in "${variants[@]}"; do
  name=${variant%%:*}
  spec=${variant#*:}
  [[ $name =~ ^[A-Za-z0-9_-]+$ ]] || { echo "variant name '$name': letters, digits, _ and -"; exit 1; }
  if [[ $spec == *@patched* && -z ${PATCH:-} ]]; then
    echo "variant $name builds @patched, but PATCH names no diff"
    exit 1
  fi
  read -ra extra <<<"${spec//@patched/$patched}"
  nvcc "${extra[@]}" "${flags[@]}" benches/probes/bf16_rows_variants.cu cuda/cpu/topk_cpu.cc \
    -o "$bin/$name" \
    >"$out/build-$name.log" 2>&1 &
  pids+=($!)
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "build of ${variants[$i]%%:*} failed:"; tail -20 "$out/build-${variants[$i]%%:*}.log"; exit 1; }
done
status=0
for round in 1 2; do
  for variant in "${variants[@]}"; do
    name=${variant%%:*}
    echo "== $name (round $round)"
    "$bin/$name" | tee "$out/run-$name-$round.txt"
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1  # a winner differed from the host's
  done
done
# Both rounds' times by variant (table.md).
specs=()
for variant in "${variants[@]}"; do
  name=${variant%%:*}
  specs+=("$name=$out/run-$name-1.txt,$out/run-$name-2.txt")
done
python3 -m benches.probes.variant_table --name-width 44 "${specs[@]}" | tee "$out/table.md"
exit $status
