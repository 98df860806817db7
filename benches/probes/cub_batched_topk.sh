#!/bin/bash
# CUB's top-k as a peer (issue 16), in one device call: the nvidia-cuda-cccl wheel's headers
# (CCCL 3.5; carry the wheel in .whl, benches/README.md), the probe built for sm_90a and run.
#   bash benches/probes/cub_batched_topk.sh [JSON_PATH]
set -eu
wheel=$(ls .whl/nvidia_cuda_cccl-*.whl | head -1)
cccl=/tmp/cccl_headers
rm -rf "$cccl" && mkdir -p "$cccl"
# No unzip on the device machine: Python unpacks the wheel.
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "$wheel" "$cccl"
nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
  -I"$cccl/nvidia/cu13/include/cccl" benches/probes/cub_batched_topk.cu -o /tmp/cub_batched_topk
/tmp/cub_batched_topk ${1:+--json "$1"}
