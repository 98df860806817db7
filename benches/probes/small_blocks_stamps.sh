#!/usr/bin/env bash
# Two probe builds of the filtered kernel (JAX_TOPK_FILTERED_PROBE) in one call: "small", whose
# layout.cuh constants are changed in a copy of the tree (SMALL_THREADS, SMALL_BLOCKS_PER_SM,
# SMALL_CANDIDATES, SMALL_CLUSTER_PARTS; defaults 256, 3, 4096, 8: "Small blocks"' shape; the
# fused indexer's candidate limit follows SMALL_CANDIDATES), and "main", the tree as it is. Each
# is stamped on bfloat16 5536 x 131072 causal rows and [256, 152064] k = 50 and timed on those
# and 32 x 131072 (benches/probes/filtered_phases.py; SHAPES=small or SHAPES=main: one build).
# PHASES_VARIANTS and PHASES_STAMPED (default new) and PHASES_DTYPES (default bfloat16) pass
# through; "stream only" times a row's sample and pass alone (benches/NOTES.md "The selecting
# phases at 8 warps, measured", which also gives the one-block-per-SM invocation). Both are
# probe builds, which spill more than release ones: compare them with each other. Two builds and
# two runs may not fit one 600 s device call. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
out=${OUT:-/tmp/small_blocks}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
export PHASES_VARIANTS=${PHASES_VARIANTS:-new} PHASES_STAMPED=${PHASES_STAMPED:-new}
export PHASES_DTYPES=${PHASES_DTYPES:-bfloat16}
threads=${SMALL_THREADS:-256} blocks_per_sm=${SMALL_BLOCKS_PER_SM:-3}
candidates=${SMALL_CANDIDATES:-4096} cluster_parts=${SMALL_CLUSTER_PARTS:-8}
root=$(pwd)
small=/tmp/small-blocks-tree
rm -rf "$small" && mkdir -p "$small"
tar -c --exclude=./build --exclude=./.git . | tar -x -C "$small"
layout=$small/cuda/kernels/filtered/layout.cuh
# Each constant set, then checked (a renamed one would leave main's value silently).
for setting in "kThreadsPerBlock = $threads" "kBlocksPerSm = $blocks_per_sm" \
  "kSharedCandidates = $candidates" "kMaxClusterParts = $cluster_parts"; do
  sed -i "s/^constexpr int ${setting%% *} = .*;/constexpr int $setting;/" "$layout"
  grep -q "^constexpr int $setting;$" "$layout" || { echo "layout.cuh: no '$setting'"; exit 1; }
done
# The fused indexer's candidates must fit s.candidates (indexer_topk.cu's static_assert; the
# probe does not run the indexer).
limit=kIndexerMaxCandidates
workspace=$small/cuda/common/indexer_topk_workspace.h
sed -i "s/^constexpr int64_t $limit = .*;/constexpr int64_t $limit = $candidates;/" "$workspace"
grep -q "^constexpr int64_t $limit = $candidates;$" "$workspace" ||
  { echo "indexer_topk_workspace.h: no '$limit = $candidates'"; exit 1; }
for shape in ${SHAPES:-small main}; do
  tree=$root
  [[ $shape == small ]] && tree=$small
  start=$(date +%s)  # this shape's
  (cd "$tree" && python3 -m pip install -v --no-build-isolation --no-deps -e . \
    -C build-dir="/tmp/small-blocks-build-$shape" -C cmake.define.JAX_TOPK_CUDA=ON \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a -C cmake.define.JAX_TOPK_FILTERED_PROBE=ON \
    -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v" >"$out/build-$shape.log" 2>&1) ||
    { tail -30 "$out/build-$shape.log"; exit 1; }
  grep -E "registers|spill" "$out/build-$shape.log" | sort | uniq -c | sort -rn | head -12 \
    >"$out/ptxas-$shape.txt"
  echo "$shape: built in $(($(date +%s) - start)) s"
  (cd "$tree" && timeout "${PHASES_LIMIT_S:-150}" python3 -m benches.probes.filtered_phases \
    --stamps 2>&1 | grep -v "^[WI]0\|^E0" >"$out/phases-$shape.log")
  echo "$shape: done at $(($(date +%s) - start)) s"
done
for shape in ${SHAPES:-small main}; do
  echo "== $shape"
  grep -A2 "^stamps " "$out/phases-$shape.log" | grep -v "^--"
  grep "^| " "$out/phases-$shape.log"
done
