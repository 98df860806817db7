#!/bin/bash
# merge_topk's sorted-runs path alone (benches/probes/merge_runs.cu), in one device call: built
# for sm_90a, checked against its host reference on every row kind, then timed at 5536 rows of
# 8 sorted lists of 2048 against the read floor. Exit status 1 on any mismatch. Its kernel's
# logic can be checked first without a GPU: benches/probes/merge_runs_on_host.cc.
#   bash benches/probes/merge_runs.sh
set -eu
nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -Icuda -I. \
  -Xptxas=-v benches/probes/merge_runs.cu cuda/kernels/merge_topk.cu -o /tmp/merge_runs 2>&1 | grep -E "registers|spill" || true
/tmp/merge_runs
