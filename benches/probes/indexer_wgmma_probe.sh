#!/bin/bash
# One device call: builds the probe's variants, checks them, times them (benches/NOTES.md).
#   bash benches/probes/indexer_wgmma_probe.sh "name:-DFLAG=1 ..." ...   (first = default build)
#   PROBE_MODE=fp8 bash ...   the fp8 checks and the fp8 against bf16 timings instead
set -u
probe_mode=${PROBE_MODE:-}
small_mode=small; [ "$probe_mode" = fp8 ] && small_mode=fp8small
out=${OUT:-/tmp}
flags="-O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a -DJAX_TOPK_INDEXER_WGMMA_SM90A -Icuda"
for variant in "$@"; do
  name=${variant%%:*}; defs=${variant#*:}
  nvcc $defs $flags benches/probes/indexer_wgmma_probe.cu -o /tmp/probe_$name &  # defs first: -I of another tree wins
done
wait
first=1
for variant in "$@"; do
  name=${variant%%:*}
  echo "== $name (${variant#*:})"
  if [ $first = 1 ]; then
    cuobjdump --dump-sass /tmp/probe_$name > $out/sass_$name.txt
    echo "GMMA: $(grep -oE '[HQ]GMMA\.[0-9x]+\.[A-Z0-9.]+' $out/sass_$name.txt | sort | uniq -c | tr '\n' ' ')  local memory: $(grep -c -E 'LDL|STL' $out/sass_$name.txt)"
    timeout 120 compute-sanitizer --tool memcheck /tmp/probe_$name $small_mode > $out/memcheck.txt 2>&1
    echo "memcheck rc=$? $(grep -E 'ERROR SUMMARY|correctness' $out/memcheck.txt | tr '\n' ' ')"
    first=0
  fi
  # Variants named diag_* compute wrong logits on purpose: timings only.
  mode=$probe_mode; case $name in diag_*) mode=time;; esac
  timeout 200 /tmp/probe_$name $mode 2>&1 | tee $out/probe_$name.txt |
    grep -E "fails [1-9]|NO|correctness|mismatch|TFLOP|error|swamp|specials|ratio"

done
