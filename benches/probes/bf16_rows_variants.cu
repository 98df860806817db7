// topk_bf16 builds timed against each other (issue 16's short bfloat16 rows; benches/NOTES.md
// "topk_bf16: walks by every warp, a guarded second pass"): the kernel source included, from this
// tree or from another tree put first on the include path (-I), and launched directly, no JAX.
// Per shape: us a launch in a CUDA graph of back-to-back launches whose rows span 128 MB (more
// than the L2, so every launch reads its rows from HBM), and whether set 0's winners equal the
// CPU handler's (TopkCpu, cuda/cpu/topk_cpu.cc: the GPU tests' reference) in every slot of every
// row, special rows included (main); the exit status says whether any differed; built with
// -DJAX_TOPK_BF16_STAMPS=1, each block's phase times too (PrintPhases). Some shapes pass a page
// table (unmapped and huge entries among its pages). ONLY_SHAPE=i runs the i-th shape alone (for
// a profiler: `ONLY_SHAPE=4 ncu --launch-count 1 ...` profiles the 2048-row shape's first
// launch). Built and run by bf16_rows_variants.sh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "cpu/topk_cpu.h"
#include "graph_timing.cuh"
#include "kernels/topk_bf16.cu"

// The kernels topk_bf16.cu forwards some rows to are not linked: the probe's shapes are none of
// theirs, and the stubs refuse every row so that LaunchTopkBf16 keeps its own kernel.
namespace jax_topk {
bool TopkArgmaxServes(const TopkProblem&) {
  return false;
}
cudaError_t LaunchTopkArgmax(const TopkProblem&, cudaStream_t) {
  return cudaErrorNotSupported;
}
bool TopkF32RowsBeatsTopkBf16(const TopkProblem&) {
  return false;
}
cudaError_t LaunchTopkF32Rows(const TopkProblem&, cudaStream_t) {
  return cudaErrorNotSupported;
}
}  // namespace jax_topk

namespace {

struct Shape {
  int rows;
  int width;
  int k;
  int length;  // every row's
  bool sorted;
  int log2_page_size = -1;  // >= 0: a page table of that page size, one table row a row
};

uint16_t FloatToBf16(float value) {  // round to nearest even
  return __bfloat16_as_ushort(__float2bfloat16_rn(value));
}

#if JAX_TOPK_BF16_STAMPS
// The stamps build (-DJAX_TOPK_BF16_STAMPS=1): five launches on fresh sets, each alone on an idle
// GPU, and for each phase the median over blocks and launches of its ns since the block's
// previous stamp (a phase a row skips, as pass 2 of a row of at most k candidates, is left out
// and its time goes to the next); "skew" is a block's entry after the launch's first block.
template <class LaunchSet>
void PrintPhases(cudaStream_t stream, const LaunchSet& launch_set, int sets) {
  using jax_topk::kBlockPhases;
  using jax_topk::kStampedBlocks;
  static unsigned long long stamps[kStampedBlocks][kBlockPhases];
  const char* const names[kBlockPhases] = {"skew",  "load",  "pass1", "walk1",
                                           "pass2", "walk2", "take",  "store"};
  std::vector<std::vector<double>> phase(kBlockPhases);
  for (int trial = 0; trial < 5; ++trial) {
    std::memset(stamps, 0, sizeof(stamps));
    CHECK(cudaMemcpyToSymbol(jax_topk::g_bf16_stamps, stamps, sizeof(stamps)));
    CHECK(cudaDeviceSynchronize());
    launch_set((trial + 1) % sets);
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpyFromSymbol(stamps, jax_topk::g_bf16_stamps, sizeof(stamps)));
    unsigned long long first = ~0ull;
    for (const auto& block : stamps) {
      if (block[0] != 0) first = std::min(first, block[0]);
    }
    for (const auto& block : stamps) {
      if (block[0] == 0) continue;
      phase[0].push_back(static_cast<double>(block[0] - first));
      unsigned long long last = block[0];
      for (int p = 1; p < kBlockPhases; ++p) {
        if (block[p] == 0) continue;
        phase[p].push_back(static_cast<double>(block[p] - last));
        last = block[p];
      }
    }
  }
  std::printf("  stamps, median ns:");
  for (int p = 0; p < kBlockPhases; ++p) {
    std::vector<double>& v = phase[p];
    if (v.empty()) continue;
    std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
    std::printf(" %s %.0f", names[p], v[v.size() / 2]);
  }
  std::printf("\n");
}
#endif

}  // namespace

int main() {
  const Shape shapes[] = {
      {1, 16384, 512, 16384, false},
      {32, 16384, 512, 16384, false},
      {128, 16384, 512, 16384, false},
      {512, 16384, 512, 16384, false},
      {2048, 16384, 512, 16384, false},
      {2048, 16384, 512, 9000, false},
      {2048, 16384, 512, 4096, false},
      {128, 16384, 512, 16384, true},
      {512, 16384, 2048, 16384, true},
      {32, 16384, 512, 300, false},
      // Paged (the bench's decode rows: page 64; 256 entries a row used), sorted by counts and
      // by the radix sort too, and pages of 16 (1024 entries used); rows shorter than the width
      // that keep the width's slice size (16000, 12345) or not (2000, 300): the cases of
      // benches/NOTES.md "topk_bf16: loads before the length, page tables in shared memory".
      {1, 16384, 512, 16384, false, 6},
      {128, 16384, 512, 16384, false, 6},
      {128, 16384, 512, 16384, true, 6},
      {64, 16384, 2048, 16000, true, 6},
      {32, 16384, 512, 12345, false, 4},
      {32, 16384, 512, 16000, false},
      {128, 16384, 512, 2000, false},
      // Few rows and short rows in a wide array: the shapes that decided benches/NOTES.md
      // "topk_bf16: a row over a cluster" (its patch, bf16_cluster.patch, split them over
      // clusters; the kernel here takes each row on one block).
      {2, 16384, 512, 16384, false},
      {4, 16384, 512, 16384, false},
      {8, 16384, 512, 16384, false},
      {16, 16384, 512, 16384, false},
      {1, 12000, 512, 12000, false},
      {1, 9000, 512, 9000, false},
      {1, 16384, 512, 9000, false},
      {4, 16384, 512, 300, false},
  };
  cudaStream_t stream;
  CHECK(cudaStreamCreate(&stream));
  // A pool of 256 MB of bfloat16 normals; a launch reads set i % sets, sets of one shape's rows.
  // Rows 1-4 of the pool, in set 0 of every shape of more than 4 rows (the set checked against
  // the host), are the contract's special cases: a constant row (ties everywhere), a row of
  // negatives with +-0 and -inf among them (-0 ranks below +0), a row of NaNs but for 100 values
  // (fewer candidates than k: -1 slots), and a row of +-0 and -inf alone. The length-300 shape
  // gives every row fewer candidates than k.
  constexpr size_t kPoolElems = size_t{128} << 20;
  constexpr int kWidest = 16384;
  std::vector<uint16_t> host(kPoolElems);
  std::mt19937 generator(11);
  std::normal_distribution<float> normal;
  for (uint16_t& bits : host) bits = FloatToBf16(normal(generator));
  uint16_t* const constant_row = host.data() + 1 * kWidest;
  uint16_t* const negative_row = host.data() + 2 * kWidest;
  uint16_t* const nan_row = host.data() + 3 * kWidest;
  uint16_t* const zeros_row = host.data() + 4 * kWidest;
  for (int c = 0; c < kWidest; ++c) {
    constant_row[c] = FloatToBf16(0.5f);
    negative_row[c] = negative_row[c] | 0x8000;  // -|x|
    nan_row[c] = c % 163 == 5 ? FloatToBf16(normal(generator)) : 0x7FC0;
    zeros_row[c] = c % 3 == 0 ? 0x8000 : (c % 3 == 1 ? 0x0000 : 0xFF80);  // -0, +0, -inf
  }
  for (int c = 3; c < kWidest; c += 1000) {
    negative_row[c] = 0x8000;      // -0
    negative_row[c + 1] = 0x0000;  // +0
    negative_row[c + 2] = 0xFF80;  // -inf
  }
  uint16_t* scores;
  CHECK(cudaMalloc(&scores, kPoolElems * 2));
  CHECK(cudaMemcpy(scores, host.data(), kPoolElems * 2, cudaMemcpyHostToDevice));
  int32_t* lengths;
  CHECK(cudaMalloc(&lengths, 2048 * sizeof(int32_t)));
  int32_t* out;
  CHECK(cudaMalloc(&out, size_t{2048} * 2048 * sizeof(int32_t)));
  // Page tables: up to 2048 rows of 16384 / 16 + 1 entries, mostly distinct pages, with
  // unmapped (-1) and huge entries among them; a paged shape uses the first rows * pages.
  constexpr int kMostPages = kWidest / 16 + 1;
  std::vector<int32_t> host_table(size_t{2048} * kMostPages);
  for (size_t i = 0; i < host_table.size(); ++i) {
    host_table[i] =
        i % 97 == 3 ? -1 : (i % 89 == 7 ? 0x7FFFFFF : static_cast<int32_t>(i * 7 % 100003));
  }
  int32_t* table;
  CHECK(cudaMalloc(&table, host_table.size() * sizeof(int32_t)));
  CHECK(cudaMemcpy(table, host_table.data(), host_table.size() * sizeof(int32_t),
                   cudaMemcpyHostToDevice));

  // ONLY_SHAPE=i runs the i-th shape alone (so that a profiler's first launch is that shape's).
  const char* const only_shape = std::getenv("ONLY_SHAPE");
  const int shape_count = static_cast<int>(sizeof(shapes) / sizeof(shapes[0]));
  if (only_shape != nullptr) {
    char* end = nullptr;
    const long index = std::strtol(only_shape, &end, 10);
    if (*only_shape == '\0' || *end != '\0' || index < 0 || index >= shape_count) {
      std::fprintf(stderr, "ONLY_SHAPE=%s: a shape index, 0 to %d\n", only_shape, shape_count - 1);
      return 2;
    }
  }
  bool any_wrong = false;
  std::printf("%-44s %10s %s\n", "shape", "us/launch", "winners");
  for (const Shape& shape : shapes) {
    if (only_shape != nullptr && &shape - shapes != std::atoi(only_shape)) continue;
    std::vector<int32_t> row_lengths(shape.rows, shape.length);
    CHECK(cudaMemcpy(lengths, row_lengths.data(), shape.rows * sizeof(int32_t),
                     cudaMemcpyHostToDevice));
    const size_t set_elems = static_cast<size_t>(shape.rows) * shape.width;
    const int sets = static_cast<int>(std::max<size_t>(1, kPoolElems / set_elems));
    const auto problem_for = [&](int set) {
      jax_topk::TopkProblem problem;
      problem.scores = scores + set_elems * set;
      problem.score_type = jax_topk::ScoreType::kBfloat16;
      problem.rows = shape.rows;
      problem.width = shape.width;
      problem.k = shape.k;
      problem.sorted = shape.sorted;
      problem.lengths = lengths;
      problem.out = out;
      if (shape.log2_page_size >= 0) {
        problem.page_table = table;
        problem.log2_page_size = shape.log2_page_size;
        problem.pages = (shape.width >> shape.log2_page_size) + 1;
        problem.table_count = shape.rows;
      }
      return problem;
    };
    // Set 0 against the CPU handler's algorithm (the reference of the GPU tests), every slot.
    CHECK(jax_topk::LaunchTopkBf16(problem_for(0), stream));
    CHECK(cudaStreamSynchronize(stream));
    std::vector<int32_t> got(static_cast<size_t>(shape.rows) * shape.k);
    CHECK(cudaMemcpy(got.data(), out, got.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    std::vector<int32_t> want(got.size());
    jax_topk::TopkProblem reference = problem_for(0);
    reference.scores = host.data();
    reference.lengths = row_lengths.data();
    reference.out = want.data();
    if (shape.log2_page_size >= 0) reference.page_table = host_table.data();
    jax_topk::TopkCpu(reference, [](std::function<void()> task) { task(); }, 0);
    int wrong_rows = 0;
    for (int r = 0; r < shape.rows; ++r) {
      const auto row_begin = static_cast<size_t>(r) * shape.k;
      wrong_rows += !std::equal(want.begin() + row_begin, want.begin() + row_begin + shape.k,
                                got.begin() + row_begin);
    }
    // Enough launches that their rows span 128 MB (more than the L2) before the graph repeats:
    // up to 4096 launches of distinct sets, or at least 64 cycling through sets of >= 64 MB.
    const size_t set_bytes = set_elems * sizeof(uint16_t);
    const int launches = static_cast<int>(
        std::max<size_t>(64, std::min<size_t>(4096, (size_t{1} << 27) / set_bytes)));
    const float us = GraphUs(stream, launches, [&](int i) {
      CHECK(jax_topk::LaunchTopkBf16(problem_for(i % sets), stream));
    });
    char name[64];
    char page[16] = "";
    if (shape.log2_page_size >= 0)
      std::snprintf(page, sizeof(page), " page=%d", 1 << shape.log2_page_size);
    std::snprintf(name, sizeof(name), "%dx%d k=%d len=%d%s%s", shape.rows, shape.width, shape.k,
                  shape.length, shape.sorted ? " sorted" : "", page);
    std::printf("%-44s %10.2f %s\n", name, us, wrong_rows ? "WRONG" : "equal");
    if (wrong_rows) std::printf("  %d rows differ from the host\n", wrong_rows);
    any_wrong = any_wrong || wrong_rows != 0;
#if JAX_TOPK_BF16_STAMPS
    PrintPhases(
        stream, [&](int set) { CHECK(jax_topk::LaunchTopkBf16(problem_for(set), stream)); }, sets);
#endif
  }
  return any_wrong ? 1 : 0;
}
