// Where topk_f32_cluster's time goes (issue 16; benches/NOTES.md "topk_f32_cluster, by phase"):
// the kernel source included with JAX_TOPK_F32_CLUSTER_STAMPS set, so thread 0 of each block
// stores the globaltimer at the end of each phase, and launched directly (no JAX) on the decode
// shapes. Prints, per shape: the time a launch takes in a CUDA graph of back-to-back launches on
// rotating inputs (no stamps in that build's timing: -DJAX_TOPK_F32_CLUSTER_STAMPS=0 gives the
// clean binary), the same for empty kernels of the same launch shape (the fixed cost), and the
// median over blocks of each phase's ns since the block's previous stamp, with the blocks'
// entry skew; then each warp's own loops over its keys (lane 0's globaltimer where the warp
// leaves the loop, from the block stamp before it), median and 90th percentile over warps.
// Built and run by f32_cluster_stamps.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "graph_timing.cuh"
#include "kernels/topk_f32_cluster.cu"

namespace {

__global__ void EmptyKernel(int* sink) {
  extern __shared__ int shared_words[];
  if (sink != nullptr && threadIdx.x == 0) shared_words[0] = blockIdx.x;
}

// Empty cluster kernel that crosses one cluster barrier (every cluster kernel that reads
// another block's shared memory has at least one).
__global__ void EmptyClusterSync(int* sink) {
  extern __shared__ int shared_words[];
  cooperative_groups::this_cluster().sync();
  if (sink != nullptr && threadIdx.x == 0) shared_words[0] = blockIdx.x;
}

struct Shape {
  const char* name;
  int rows;
  int width;
  int k;
  bool sorted;
  bool values;
};

}  // namespace

int main(int argc, char** argv) {
  const bool ncu = argc > 1 && std::strcmp(argv[1], "--ncu") == 0;
  const Shape shapes[] = {
      {"1x32768 k=2048", 1, 32768, 2048, false, false},
      {"4x32768 k=2048", 4, 32768, 2048, false, false},
      {"1x16384 k=2048", 1, 16384, 2048, false, false},
      {"1x65536 k=2048", 1, 65536, 2048, false, false},
      {"1x131072 k=2048", 1, 131072, 2048, false, false},
      {"top_k 1x32768 k=256", 1, 32768, 256, true, true},
      {"top_k 1x152064 k=50", 1, 152064, 50, true, true},
      {"1x152064 k=256", 1, 152064, 256, false, false},
  };
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  // Rotating inputs past the 50 MB L2: each launch reads a row set no launch before it in the
  // last ~60 MB touched.
  constexpr int kSets = 64;
  const size_t most_floats = size_t{4} * 152064;
  std::vector<float> host(most_floats * kSets);
  std::mt19937 generator(7);
  std::normal_distribution<float> normal;
  for (float& value : host) value = normal(generator);
  float* scores;
  CHECK(cudaMalloc(&scores, host.size() * sizeof(float)));
  CHECK(cudaMemcpy(scores, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice));
  // Every row passes its length (the full width), as the bench's topk_filtered calls do: the
  // kernel's loads must not wait for it.
  int32_t* lengths;
  CHECK(cudaMalloc(&lengths, 4 * sizeof(int32_t)));
  int32_t* out;
  uint32_t* values;
  CHECK(cudaMalloc(&out, size_t{4} * 2048 * kSets * sizeof(int32_t)));
  CHECK(cudaMalloc(&values, size_t{4} * 2048 * kSets * sizeof(uint32_t)));

  const auto problem_for = [&](const Shape& shape, int set) {
    jax_topk::TopkProblem problem;
    problem.scores = scores + most_floats * set;
    problem.rows = shape.rows;
    problem.width = shape.width;
    problem.k = shape.k;
    problem.sorted = shape.sorted;
    problem.out = out + size_t{4} * 2048 * set;
    problem.values = shape.values ? values + size_t{4} * 2048 * set : nullptr;
    problem.lengths = lengths;
    return problem;
  };
  // The winners of set 0 against the host's (value descending, column ascending; random normals
  // have no ties), as sets of columns: a variant that is fast and wrong says so here.
  const auto check = [&](const Shape& shape) {
    CHECK(jax_topk::LaunchTopkF32Cluster(problem_for(shape, 0), stream));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<int32_t> got(size_t{4} * 2048);
    CHECK(cudaMemcpy(got.data(), out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    int wrong_rows = 0;
    for (int r = 0; r < shape.rows; ++r) {
      const float* row = host.data() + size_t{r} * shape.width;
      std::vector<int32_t> order(shape.width);
      for (int c = 0; c < shape.width; ++c) order[c] = c;
      std::partial_sort(order.begin(), order.begin() + shape.k, order.end(), [&](int a, int b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
      });
      std::vector<int32_t> want(order.begin(), order.begin() + shape.k);
      std::vector<int32_t> mine(got.begin() + size_t{r} * shape.k,
                                got.begin() + size_t{r + 1} * shape.k);
      if (shape.sorted) {
        wrong_rows += mine != want;
      } else {
        std::sort(want.begin(), want.end());
        std::sort(mine.begin(), mine.end());
        wrong_rows += mine != want;
      }
    }
    return wrong_rows;
  };
  std::printf("%-22s %8s %8s | stamps: median ns a phase over blocks\n", "shape", "us/launch",
              "span us");
  for (const Shape& shape : shapes) {
    {
      std::vector<int32_t> full(4, shape.width);
      CHECK(
          cudaMemcpy(lengths, full.data(), full.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    }
    if (ncu) {
      for (int set = 0; set < 3; ++set) {
        CHECK(jax_topk::LaunchTopkF32Cluster(problem_for(shape, set), stream));
      }
      CHECK(cudaStreamSynchronize(stream));
      continue;
    }
    // Warm-up and plan.
    const int wrong_rows = check(shape);
    const float us = GraphUs(stream, 64, [&](int i) {
      CHECK(jax_topk::LaunchTopkF32Cluster(problem_for(shape, i % kSets), stream));
    });
    std::printf("%-22s %8.2f%s", shape.name, us, wrong_rows ? " WRONG" : "");
#if JAX_TOPK_F32_CLUSTER_STAMPS
    CHECK(cudaDeviceSynchronize());
    static unsigned long long stamps[1024][jax_topk::kStampSlots];
    // The kernel's stamp slots in the order they are taken, and their names.
    constexpr int kPlaces = 16;
    constexpr int kOrder[kPlaces] = {0, 1, 2, 3, 4, 14, 5, 6, 7, 15, 8, 9, 10, 11, 12, 13};
    const char* kNames[kPlaces] = {"skew", "zero+issue", "h0",    "sup0",    "bin0", "gather0",
                                   "h1",   "sup1",       "bin1",  "gather1", "h2",   "sup2",
                                   "bin2", "take",       "store", "exit"};
    std::vector<std::vector<double>> phase(kPlaces);
    // Each warp's own loops (WarpStamp), from the block stamp before them: median over warps.
    constexpr int kLoops = 6;
    const char* kLoopNames[kLoops] = {"keys",   "landed",     "h0loop",
                                      "h1loop", "gatherloop", "storeloop"};
    std::vector<std::vector<double>> loop(kLoops);
    static unsigned long long warp_stamps[1024][jax_topk::kThreads / 32][jax_topk::kWarpStampSlots];
    double span_max = 0;
    for (int trial = 0; trial < 5; ++trial) {
      CHECK(cudaMemset(out, 0, 4));  // a gap: the launch below starts on an idle GPU
      std::memset(stamps, 0, sizeof(stamps));
      std::memset(warp_stamps, 0, sizeof(warp_stamps));
      CHECK(cudaMemcpyToSymbol(jax_topk::g_warp_stamps, warp_stamps, sizeof(warp_stamps)));
      CHECK(cudaMemcpyToSymbol(jax_topk::g_cluster_stamps, stamps, sizeof(stamps)));
      CHECK(cudaDeviceSynchronize());
      CHECK(jax_topk::LaunchTopkF32Cluster(problem_for(shape, 1 + trial), stream));
      CHECK(cudaDeviceSynchronize());
      CHECK(cudaMemcpyFromSymbol(stamps, jax_topk::g_cluster_stamps, sizeof(stamps)));
      CHECK(cudaMemcpyFromSymbol(warp_stamps, jax_topk::g_warp_stamps, sizeof(warp_stamps)));
      const int blocks = shape.rows * 16;
      unsigned long long first = ~0ull, last = 0;
      for (int b = 0; b < blocks; ++b) {
        first = std::min(first, stamps[b][0]);
        last = std::max(last, stamps[b][13]);
      }
      span_max = std::max(span_max, (last - first) / 1e3);
      for (int b = 0; b < blocks; ++b) {
        // (warp slot, the block stamp it is timed from: the barrier before the loop)
        const int from[kLoops][2] = {{jax_topk::kKeysMade, 0},
                                     {jax_topk::kKeysLanded, -1},
                                     {jax_topk::kFirstHistogramLooped, 1},
                                     {jax_topk::kSecondHistogramLooped, 4},
                                     {jax_topk::kCandidatesPushed, 7},
                                     {jax_topk::kWinnersStored, 11}};
        for (int w = 0; w < jax_topk::kThreads / 32; ++w) {
          for (int l = 0; l < kLoops; ++l) {
            const unsigned long long now = warp_stamps[b][w][from[l][0]];
            const unsigned long long start =
                from[l][1] < 0 ? warp_stamps[b][w][jax_topk::kKeysMade] : stamps[b][from[l][1]];
            if (now != 0 && start != 0 && now >= start) {
              loop[l].push_back(static_cast<double>(now - start));
            }
          }
        }
      }
      // Each stamp against the block's last earlier one that was taken (a row that gathers
      // candidates after a digit skips the later digits' stamps).
      for (int b = 0; b < blocks; ++b) {
        phase[0].push_back(static_cast<double>(stamps[b][0] - first));  // entry skew
        unsigned long long previous = stamps[b][0];
        for (int place = 1; place < kPlaces; ++place) {
          const unsigned long long now = stamps[b][kOrder[place]];
          if (now == 0) continue;
          phase[place].push_back(static_cast<double>(now) - static_cast<double>(previous));
          previous = now;
        }
      }
    }
    std::printf(" %8.2f |", span_max);
    for (int place = 0; place < kPlaces; ++place) {
      if (phase[place].empty()) continue;
      std::sort(phase[place].begin(), phase[place].end());
      std::printf(" %s %.0f", kNames[place], phase[place][phase[place].size() / 2]);
    }
    std::printf("\n%-22s warps' loops, ns (median / 90th percentile over warps):", "");
    for (int l = 0; l < kLoops; ++l) {
      if (loop[l].empty()) continue;
      std::sort(loop[l].begin(), loop[l].end());
      std::printf(" %s %.0f/%.0f", kLoopNames[l], loop[l][loop[l].size() / 2],
                  loop[l][loop[l].size() * 9 / 10]);
    }
#endif
    std::printf("\n");
  }
  if (!ncu) {
    // Fixed costs: empty kernels of the same launch shape (16 blocks of 512 threads, one an SM
    // by shared memory), with and without a 16-block cluster.
    const int shared_bytes = jax_topk::kSharedBytes;
    CHECK(cudaFuncSetAttribute(EmptyKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               shared_bytes));
    CHECK(cudaFuncSetAttribute(EmptyClusterSync, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               shared_bytes));
    CHECK(cudaFuncSetAttribute(EmptyKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    CHECK(
        cudaFuncSetAttribute(EmptyClusterSync, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    for (int parts : {1, 8, 16}) {
      for (int rows : {1, 4}) {
        for (int sync = 0; sync < 2; ++sync) {
          if (parts == 1 && sync) continue;
          const float us = GraphUs(stream, 64, [&](int) {
            cudaLaunchAttribute attribute;
            const cudaLaunchConfig_t config = jax_topk::ClusterLaunchConfig(
                rows * 16, parts, 512, shared_bytes, stream, attribute);
            int* sink = nullptr;
            void* arguments[] = {&sink};
            CHECK(cudaLaunchKernelExC(&config,
                                      sync ? reinterpret_cast<const void*>(&EmptyClusterSync)
                                           : reinterpret_cast<const void*>(&EmptyKernel),
                                      arguments));
          });
          std::printf("empty %2d blocks, cluster %2d%s: %.2f us/launch\n", rows * 16, parts,
                      sync ? " + cluster.sync" : "", us);
        }
      }
    }
    const float one_block =
        GraphUs(stream, 64, [&](int) { EmptyKernel<<<1, 32, 0, stream>>>(nullptr); });
    std::printf("empty 1 block of 32 threads: %.2f us/launch\n", one_block);
  }
  CHECK(cudaDeviceSynchronize());
  CHECK(cudaFree(lengths));
  CHECK(cudaFree(values));
  CHECK(cudaFree(out));
  CHECK(cudaFree(scores));
  return 0;
}
