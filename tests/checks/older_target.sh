#!/usr/bin/env bash
# A build whose CUDA code is compute_80 PTX only (the driver JIT-compiles it for the GPU at
# hand), checked on a Hopper GPU by tests.checks.older_target. From the repo root:
#   bash tests/checks/older_target.sh build   builds the wheel into build/older-target-wheel
#                                             (installs nothing, so it may run beside tests of
#                                             the installed build)
#   bash tests/checks/older_target.sh check   installs that wheel over the installed jax_topk and
#                                             runs the check (reinstall the usual build after)
# No argument: both.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheel_dir=build/older-target-wheel
step=${1:-all}
if [[ $step == build || $step == all ]]; then
  rm -rf "$wheel_dir"
  python3 -m pip wheel -q --no-build-isolation --no-deps . -w "$wheel_dir" \
    -C build-dir=build/older-target -C cmake.define.JAX_TOPK_CUDA=ON \
    -C cmake.define.CMAKE_CUDA_ARCHITECTURES=80-virtual
fi
if [[ $step == check || $step == all ]]; then
  python3 -m pip install -q --no-deps --force-reinstall "$wheel_dir"/jax_topk-*.whl
  # Run from a copy of the tests: in the repo root, its jax_topk/ (sources, no extensions)
  # would shadow the installed one.
  copy=$(mktemp -d)
  trap 'rm -rf "$copy"' EXIT
  cp -r tests "$copy/"
  (cd "$copy" && python3 -m tests.checks.older_target)
fi
