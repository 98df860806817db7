// merge_topk for rows that arrive as a few sorted runs (the lists of top_k(sorted=True) calls:
// a running top-k over key chunks, split-KV decode), alone: the algorithm of
// benches/probes/merge_runs_model.py on the GPU, checked against a host reference and timed
// against the read floor and against today's merge_topk kernel (linked in) on the same rows.
// Not in the product: this probe says whether the path is worth it.
// A persistent 512-thread block an SM (192 KB of shared memory), a row at a time:
// 1. The row's 64-bit rank keys R = ordered key << 32 | ~column (0: column < 0 or NaN) into
//    shared memory; every place whose R is above its left neighbour's starts a run. More than
//    kMaxRuns runs: the row is not this path's (the probe flags it; the product would take its
//    existing path).
// 2. Runs cut to k; a tree of pairwise merges, each output cut to k (places into the row,
//    16-bit, ping-ponged). A level's outputs are one range split evenly over the threads: a
//    thread finds its first output's source by a binary search of its pair (the co-rank,
//    ties to the left run), then merges its share one output at a time.
// 3. The last sequence's first min(k, candidates) places are written, in rank order.
// The kernel: merge_runs_kernel.cuh; the rows and the reference: merge_runs_rows.h (both also
// run on the host by merge_runs_on_host.cc). Build and run: bash benches/probes/merge_runs.sh
// (prints a table; exit status 1 on a mismatch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "benches/probes/merge_runs_kernel.cuh"
#include "benches/probes/merge_runs_rows.h"
#include "kernels/merge_cuda.h"

using jax_topk::Bf16Values;
using jax_topk::F32Values;

namespace {

template <typename Values>
struct Run {
  using Bits = typename Values::Bits;
  Bits* values;
  int32_t* indices;
  Bits* out_values;
  int32_t* out_indices;
  int64_t rows;
  int width, k, grid;
  // Device copies of a row set's candidates and room for the results.
  void Upload(const std::vector<Bits>& host_values, const std::vector<int32_t>& host_indices) {
    cudaMalloc(&values, host_values.size() * sizeof(Bits));
    cudaMalloc(&indices, host_indices.size() * 4);
    cudaMalloc(&out_values, rows * k * sizeof(Bits));
    cudaMalloc(&out_indices, rows * k * 4);
    cudaMemcpy(values, host_values.data(), host_values.size() * sizeof(Bits),
               cudaMemcpyHostToDevice);
    cudaMemcpy(indices, host_indices.data(), host_indices.size() * 4, cudaMemcpyHostToDevice);
  }
  void Free() {
    cudaFree(values);
    cudaFree(indices);
    cudaFree(out_values);
    cudaFree(out_indices);
  }
  void Launch(bool prefetch, cudaStream_t stream = 0) const {
    merge_runs::MergeRunsKernel<Values>
        <<<grid, merge_runs::kThreads, sizeof(merge_runs::Shared), stream>>>(
            values, indices, rows, width, k, prefetch, out_values, out_indices);
  }
};

// Runs one case on the device; returns the mismatching rows (and prints the first).
template <typename Values>
int64_t Check(const char* name, std::mt19937& rng, int64_t rows, merge_runs::Shape shape, int kind,
              int sms) {
  using Bits = typename Values::Bits;
  const merge_runs::Case<Values> check(rng, rows, shape, kind, merge_runs::kMaxRuns);
  const int k = check.k;
  Run<Values> run{nullptr, nullptr,     nullptr, nullptr,
                  rows,    check.width, k,       static_cast<int>(std::min<int64_t>(rows, sms))};
  run.Upload(check.values, check.indices);
  run.Launch(false);
  std::vector<Bits> got_values(rows * k);
  std::vector<int32_t> got_indices(rows * k);
  cudaMemcpy(got_values.data(), run.out_values, rows * k * sizeof(Bits), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_indices.data(), run.out_indices, rows * k * 4, cudaMemcpyDeviceToHost);
  const cudaError_t status = cudaDeviceSynchronize();
  const int64_t bad = check.Mismatches(name, got_values, got_indices, merge_runs::kNotRuns,
                                       cudaGetErrorString(status));
  run.Free();
  return bad + (status != cudaSuccess);
}

float MedianUs(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0f;
}

// The median of 20 timed calls of launch() (after one untimed), us.
template <typename Launcher>
float TimeUs(Launcher launch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int repeat = 0; repeat < 21; ++repeat) {
    cudaEventRecord(start);
    launch();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float elapsed;
    cudaEventElapsedTime(&elapsed, start, stop);
    if (repeat > 0) ms.push_back(elapsed);
  }
  return MedianUs(ms);
}

// The copy rate (bytes read plus written a second) of a device-to-device copy of `bytes`.
double CopyRate(size_t bytes) {
  void *a, *b;
  cudaMalloc(&a, bytes);
  cudaMalloc(&b, bytes);
  const float us = TimeUs([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); });
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (us * 1e-6);
}

// 5536 rows of 8 lists of 2048, k = 2048, sorted output: the probe on sorted lists (with and
// without the next row pulled into L2), and today's merge_topk kernel on the same rows and on
// the bench's unsorted lists (columns ascending), against the read floor.
template <typename Values>
int64_t Bench(const char* dtype, std::mt19937& rng, int sms, double copy_rate) {
  using Bits = typename Values::Bits;
  const int64_t rows = 5536;
  const int lists = 8, per_list = 2048, k = 2048, width = lists * per_list;
  const double floor_us = rows * width * (sizeof(Bits) + 4.0) / copy_rate * 1e6;
  int64_t bad = 0;
  for (const int kind : {0, 6}) {  // sorted lists, then unsorted ones
    std::vector<Bits> values;
    std::vector<int32_t> indices;
    merge_runs::MakeRows<Values>(rng, rows, lists, per_list, kind, &values, &indices);
    Run<Values> run{nullptr, nullptr, nullptr, nullptr, rows, width, k, sms};
    run.Upload(values, indices);
    const char* input = kind == 0 ? "sorted lists" : "unsorted lists";
    const auto row = [&](const char* variant, float us) {
      std::printf("| %s | 5536 x 8 x 2048, %s | %s | %.1f | %.1f | %.2fx |\n", dtype, input,
                  variant, us, floor_us, us / floor_us);
    };
    if (kind == 0) {
      for (const bool prefetch : {false, true})
        row(prefetch ? "runs probe, next row into L2" : "runs probe, no prefetch",
            TimeUs([&] { run.Launch(prefetch); }));
    }
    jax_topk::MergeProblem problem;
    problem.values = run.values;
    problem.indices = run.indices;
    problem.score_type =
        sizeof(Bits) == 4 ? jax_topk::ScoreType::kFloat32 : jax_topk::ScoreType::kBfloat16;
    problem.rows = rows;
    problem.width = width;
    problem.k = k;
    problem.sorted = true;
    Bits* today_values;
    int32_t* today_indices;
    cudaMalloc(&today_values, rows * k * sizeof(Bits));
    cudaMalloc(&today_indices, rows * k * 4);
    problem.out_values = today_values;
    problem.out_indices = today_indices;
    row("merge_topk kernel today", TimeUs([&] { jax_topk::LaunchMergeTopk(problem, 0); }));
    if (kind == 0) {  // the probe and today's kernel write the same bits
      run.Launch(false);
      std::vector<Bits> a(rows * k), b(rows * k);
      std::vector<int32_t> c(rows * k), d(rows * k);
      cudaMemcpy(a.data(), run.out_values, a.size() * sizeof(Bits), cudaMemcpyDeviceToHost);
      cudaMemcpy(b.data(), today_values, b.size() * sizeof(Bits), cudaMemcpyDeviceToHost);
      cudaMemcpy(c.data(), run.out_indices, c.size() * 4, cudaMemcpyDeviceToHost);
      cudaMemcpy(d.data(), today_indices, d.size() * 4, cudaMemcpyDeviceToHost);
      const bool same = a == b && c == d;
      bad += !same;
      std::printf("|   | (the probe's output %s today's kernel's) | | | | |\n",
                  same ? "equals" : "DIFFERS FROM");
    }
    cudaFree(today_values);
    cudaFree(today_indices);
    run.Free();
  }
  return bad;
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaFuncSetAttribute(merge_runs::MergeRunsKernel<F32Values>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(merge_runs::Shared));
  cudaFuncSetAttribute(merge_runs::MergeRunsKernel<Bf16Values>,
                       cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(merge_runs::Shared));
  std::mt19937 rng(15);
  const int64_t bad = merge_runs::ForEveryCheck(
      [&](auto values, const char* name, merge_runs::Shape shape, int kind) {
        return Check<decltype(values)>(name, rng, 300, shape, kind, sms);
      });
  const double copy_rate = CopyRate(size_t{1} << 30);
  std::printf("\ncopy rate %.2f TB/s (read + write)\n\n", copy_rate / 1e12);
  std::printf(
      "| dtype | shape | variant | us | read floor us | x floor |\n| --- | --- | --- | --- | --- | "
      "--- |\n");
  const int64_t bench_bad = Bench<F32Values>("float32", rng, sms, copy_rate) +
                            Bench<Bf16Values>("bfloat16", rng, sms, copy_rate);
  const bool exact = bad == 0 && bench_bad == 0;
  std::printf("\n%s\n", exact ? "every check exact" : "MISMATCHES: see above");
  return exact ? 0 : 1;
}
