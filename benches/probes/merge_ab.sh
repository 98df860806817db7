#!/usr/bin/env bash
# One device call comparing the merge kernel of this tree (new) with older versions of some of
# its files (old) on the same machine: a release build; `pytest -m gpu tests/test_merge_topk.py`
# and memcheck of the merge cases on the new build; benches/probes/merge_rows.py's table and
# Nsight Compute's shared-memory bank conflicts (benches/probes/filtered_ncu.py's merge cases)
# on each build. The old files come from ab_base/, the tree's paths under it, e.g.
#   mkdir -p ab_base/cuda/kernels && git show HEAD~1:cuda/kernels/merge_fine_buckets.cuh \
#     > ab_base/cuda/kernels/merge_fine_buckets.cuh
# (ab_base/ is ignored by git: name it in the device call's `carry`). Each is copied over its
# path for the old build (an incremental rebuild) and put back at the end. Logs under $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/merge_ab}
mkdir -p "$out"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
start=$(date +%s)
metrics=l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_atom.sum
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
metrics+=,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,gpu__time_duration.sum
build() {  # the release build of release_run.sh (same build folder: only changed units rebuild)
  python3 -m pip install -v --no-build-isolation --no-deps -e . -C build-dir=/tmp/release-build \
    -C cmake.define.JAX_TOPK_CUDA=ON -C cmake.define.CMAKE_CUDA_ARCHITECTURES=90a \
    -C cmake.define.CMAKE_CUDA_FLAGS="-Xptxas=-v" >"$out/build-$1.log" 2>&1 \
    || { tail -40 "$out/build-$1.log"; exit 1; }
  echo "$1 built at $(($(date +%s) - start)) s"
  grep -A2 "MergeInRegistersKernel.*for 'sm_90a'" "$out/build-$1.log" | grep spill | sort | uniq -c
}
measure() {
  timeout "${ROWS_S:-100}" python3 -m benches.probes.merge_rows 2>&1 | grep -v "^[WIE]0" \
    | tee "$out/rows-$1.md"
  OUT=$out SKIP_BUILD=1 METRICS=$metrics TAG=-$1 KERNEL=MergeInRegistersKernel \
    CASES="merge_f32_lists merge_f32_ranked" bash benches/probes/filtered_ncu.sh
}
build new
(timeout "${TEST_S:-150}" python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider \
  tests/test_merge_topk.py >"$out/pytest.log" 2>&1; echo "pytest rc=$?" >>"$out/pytest.log") &
(timeout "${TEST_S:-150}" compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m tests.checks.sanitizer merge >"$out/memcheck.log" 2>&1
  echo "memcheck rc=$?" >>"$out/memcheck.log") &
wait
tail -n 2 "$out/pytest.log" "$out/memcheck.log"
measure new
mapfile -t swapped < <(cd ab_base && find . -type f | sed 's|^\./||')
put_back() {  # this tree's own files again, also when the old build fails
  for path in "${swapped[@]}"; do cp "$out/kept-$(echo "$path" | tr / _)" "$path"; done
}
for path in "${swapped[@]}"; do
  cp "$path" "$out/kept-$(echo "$path" | tr / _)" && cp "ab_base/$path" "$path"
done
trap put_back EXIT
build old
measure old
for f in "$out"/ncu_*; do
  echo "== $f"
  grep -E "bank_conflicts|wavefronts|duration" "$f" | sed 's/  */ /g'
done
echo "all: $(($(date +%s) - start)) s"
