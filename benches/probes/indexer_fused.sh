#!/bin/bash
# The fused indexer's device run (benches/NOTES.md "fused indexer"): build, the GPU indexer
# tests, the benchmark (fused against unfused in one process), then memcheck of small cases.
# Run from the repository root; details go to $OUT.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/indexer_fused_out}
mkdir -p "$OUT"
start=$(date +%s)
# Eight xdist workers on one GPU: none may take 75 % of its memory up front.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
if ! python3 -m pip install --no-build-isolation --no-deps -e . >"$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; exit 1
fi
echo "build $(( $(date +%s) - start )) s"
timeout 90 python3 -m pytest -m gpu -q -n 8 tests/test_indexer_fused.py >"$OUT/tests.txt" 2>&1
echo "fused tests rc $? at $(( $(date +%s) - start )) s"; grep -E "passed|failed" "$OUT/tests.txt" | tail -3
timeout 90 python3 -m benches.probes.indexer_fused --json "$OUT/bench.json" >"$OUT/bench.txt" 2>&1
echo "bench rc $? at $(( $(date +%s) - start )) s"
timeout 60 env XLA_PYTHON_CLIENT_ALLOCATOR=platform compute-sanitizer --tool memcheck \
  python3 -m benches.probes.indexer_fused_memcheck >"$OUT/memcheck.txt" 2>&1
echo "memcheck rc $? at $(( $(date +%s) - start )) s"; tail -8 "$OUT/memcheck.txt"
timeout 70 python3 -m pytest -m gpu -q -n 8 tests/test_indexer.py tests/test_indexer_behaviour.py \
  >"$OUT/tests_indexer.txt" 2>&1
echo "indexer tests rc $? at $(( $(date +%s) - start )) s"; grep -E "passed|failed" "$OUT/tests_indexer.txt" | tail -3
grep -h "^FAILED" "$OUT/tests.txt" "$OUT/tests_indexer.txt" | head -20
grep -h -m3 -A25 "^E  " "$OUT/tests.txt" "$OUT/tests_indexer.txt" | head -50
tail -6 "$OUT/bench.txt"
