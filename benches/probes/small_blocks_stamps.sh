#!/usr/bin/env bash
# The selecting phases' time at 8 warps a block (benches/NOTES.md "What the warp-specialised
# queue could reach"): two probe builds of the filtered kernel (JAX_TOPK_FILTERED_PROBE), main's
# block shape and "Small blocks"' (256 threads, three blocks an SM, 4096 shared candidates,
# clusters of at most 8 blocks: layout.cuh's constants, changed in a copy of the tree; the
# fused indexer's candidate limit with them), each stamped on bfloat16 5536 x 131072 causal rows
# and [256, 152064] k = 50 and timed on those and 32 x 131072 (SHAPES=small: the small build
# alone). Both are probe builds, which spill more than release ones: compare them with each
# other. Two builds and two runs may not fit one 600 s device call. Logs in $OUT.
# SMALL_THREADS, SMALL_BLOCKS_PER_SM, SMALL_CANDIDATES and SMALL_CLUSTER_PARTS (defaults 256,
# 3, 4096, 8) set the small build's constants; PHASES_VARIANTS and PHASES_STAMPED (default new)
# pass through: "stream only" times the sample and the pass alone, e.g. the warp-specialised
# design's streaming side (NOTES "The selecting phases at 8 warps, measured").
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
sed -i -e "s/^constexpr int kThreadsPerBlock = .*;/constexpr int kThreadsPerBlock = $threads;/" \
  -e "s/^constexpr int kBlocksPerSm = .*;/constexpr int kBlocksPerSm = $blocks_per_sm;/" \
  -e "s/^constexpr int kSharedCandidates = .*;/constexpr int kSharedCandidates = $candidates;/" \
  -e "s/^constexpr int kMaxClusterParts = .*;/constexpr int kMaxClusterParts = $cluster_parts;/" \
  "$layout"
for line in "kThreadsPerBlock = $threads" "kBlocksPerSm = $blocks_per_sm" \
  "kSharedCandidates = $candidates" "kMaxClusterParts = $cluster_parts"; do
  grep -q "^constexpr int $line;$" "$layout" || { echo "layout.cuh: no '$line'"; exit 1; }
done
# The fused indexer's candidates must fit s.candidates (indexer_topk.cu's static_assert; the
# probe does not run the indexer).
limit=kIndexerMaxCandidates
sed -i "s/^constexpr int64_t $limit = .*;/constexpr int64_t $limit = $candidates;/" \
  "$small/cuda/common/indexer_topk_workspace.h"
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
  grep -A1 "^stamps " "$out/phases-$shape.log" | grep -v "^--"
  grep "^| " "$out/phases-$shape.log"
done
