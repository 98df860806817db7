// The sorted-runs probe's kernel (merge_runs_kernel.cuh) run on the host (host_simt.h: a
// std::thread a CUDA thread) over the device probe's checks, fewer rows a check and three
// blocks taking turns at rows: the kernel's logic checked before device time is spent on it.
// Build and run (a minute or two on two cores):
//   g++ -std=c++20 -O2 -pthread -Icuda -I. benches/probes/merge_runs_on_host.cc -o /tmp/mroh
//   /tmp/mroh
#include "benches/probes/host_simt.h"
// host_simt.h first: the kernel header's __device__ and friends come from it.
#include "benches/probes/merge_runs_kernel.cuh"
#include "benches/probes/merge_runs_rows.h"

namespace {

template <typename Values>
int64_t CheckOnHost(const char* name, std::mt19937& rng, merge_runs::Shape shape, int kind) {
  constexpr int64_t kRows = 12;
  constexpr unsigned kBlocks = 3;  // each takes four rows, as a persistent block does
  const merge_runs::Case<Values> check(rng, kRows, shape, kind, merge_runs::kMaxRuns);
  std::vector<typename Values::Bits> got_values(kRows * check.k);
  std::vector<int32_t> got_indices(kRows * check.k);
  host_simt::Launch(kBlocks, merge_runs::kThreads, sizeof(merge_runs::Shared), [&] {
    merge_runs::MergeRunsKernel<Values>(check.values.data(), check.indices.data(), kRows,
                                        check.width, check.k, false, got_values.data(),
                                        got_indices.data());
  });
  return check.Mismatches(name, got_values, got_indices, merge_runs::kNotRuns, "on the host");
}

}  // namespace

int main() {
  std::mt19937 rng(15);
  const int64_t bad = merge_runs::ForEveryCheck(
      [&](auto values, const char* name, merge_runs::Shape shape, int kind) {
        return CheckOnHost<decltype(values)>(name, rng, shape, kind);
      });
  std::printf("\n%s\n", bad == 0 ? "every check exact" : "MISMATCHES: see above");
  return bad == 0 ? 0 : 1;
}
