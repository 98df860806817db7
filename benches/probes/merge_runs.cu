// merge_topk for rows that arrive as a few sorted runs (the lists of top_k(sorted=True) calls:
// a running top-k over key chunks, split-KV decode), alone: the algorithm of
// benches/probes/merge_runs_model.py on the GPU, checked against a host reference and timed
// against the read floor. Not in the product: this probe says whether the path is worth it.
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
// Build and run: bash benches/probes/merge_runs.sh (prints a table; exit status 1 on a
// mismatch).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/topk_common.h"
#include "common/value_traits.h"
#include "kernels/l2_prefetch.cuh"

using jax_topk::Bf16Values;
using jax_topk::F32Values;

namespace {

constexpr int kThreads = 512;
constexpr int kMaxWidth = 16384;
constexpr int kMaxRuns = 16;
constexpr int32_t kNotRuns = -2;  // the probe's mark of a row with more than kMaxRuns runs

struct Shared {
  uint64_t rank[kMaxWidth];              // the row's rank keys, by place
  uint16_t places[2][kMaxWidth];         // a level's sequences: places into `rank`, ping-ponged
  int32_t sequence_start[2][kMaxRuns];   // where each sequence of a level starts (level 0: in
  int32_t sequence_length[2][kMaxRuns];  // `rank`, later: in places[level % 2])
  int32_t sequences[2];
  int32_t boundaries;  // places that start a run (after place 0)
};

template <typename Values>
__device__ __forceinline__ uint64_t RankKey(typename Values::Bits bits, int32_t column) {
  if (column < 0 || Values::IsNan(bits)) return 0;
  return (static_cast<uint64_t>(Values::Key(bits)) << 32) | static_cast<uint32_t>(~column);
}

// One level: sequences of `source` (places[src], or `rank` itself at level 0) merged in pairs,
// each output cut to k, into places[dst]; thread 0 records the next level's sequences.
__device__ void MergeLevel(Shared& s, int level, int k) {
  const int src = level % 2, dst = 1 - src;
  const bool implicit = level == 0;  // level 0's sequences are runs of `rank` itself
  const int count = s.sequences[src];
  const int pairs = (count + 1) / 2;
  int pair_start[kMaxRuns / 2 + 1];
  pair_start[0] = 0;
  for (int pair = 0; pair < pairs; ++pair) {
    const int a = s.sequence_length[src][2 * pair];
    const int b = 2 * pair + 1 < count ? s.sequence_length[src][2 * pair + 1] : 0;
    pair_start[pair + 1] = pair_start[pair] + min(k, a + b);
  }
  const int total = pair_start[pairs];
  const int share = (total + kThreads - 1) / kThreads;
  int first = threadIdx.x * share;
  const int end = min(total, first + share);
  int pair = 0;
  while (first < end) {  // a share may span the end of one pair and the start of the next
    while (pair_start[pair + 1] <= first) ++pair;
    const int a_start = s.sequence_start[src][2 * pair];
    const int a = s.sequence_length[src][2 * pair];
    const bool has_b = 2 * pair + 1 < count;
    const int b_start = has_b ? s.sequence_start[src][2 * pair + 1] : 0;
    const int b = has_b ? s.sequence_length[src][2 * pair + 1] : 0;
    const auto place_a = [&](int e) {
      return implicit ? a_start + e : static_cast<int>(s.places[src][a_start + e]);
    };
    const auto place_b = [&](int e) {
      return implicit ? b_start + e : static_cast<int>(s.places[src][b_start + e]);
    };
    const int p = first - pair_start[pair];
    const int stop = min(end, pair_start[pair + 1]) - pair_start[pair];
    // Co-rank: the largest i in [lo, hi] with i == lo or A[i - 1] >= B[p - i] (ties left);
    // mid > lo >= p - b, so B[p - mid] exists.
    int lo = max(0, p - b), hi = min(p, a);
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      if (s.rank[place_a(mid - 1)] >= s.rank[place_b(p - mid)]) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    int i = lo, j = p - lo;
    int next_a = i < a ? place_a(i) : 0, next_b = j < b ? place_b(j) : 0;
    uint64_t rank_a = i < a ? s.rank[next_a] : 0, rank_b = j < b ? s.rank[next_b] : 0;
    uint16_t* const out = &s.places[dst][pair_start[pair]];
    for (int o = p; o < stop; ++o) {
      const bool take_a = j >= b || (i < a && rank_a >= rank_b);
      out[o] = static_cast<uint16_t>(take_a ? next_a : next_b);
      if (take_a) {
        ++i;
        if (i < a) next_a = place_a(i), rank_a = s.rank[next_a];
      } else {
        ++j;
        if (j < b) next_b = place_b(j), rank_b = s.rank[next_b];
      }
    }
    first = pair_start[pair] + stop;
  }
  if (threadIdx.x == 0) {
    s.sequences[dst] = pairs;
    for (int q = 0; q < pairs; ++q) {
      s.sequence_start[dst][q] = pair_start[q];
      s.sequence_length[dst][q] = pair_start[q + 1] - pair_start[q];
    }
  }
}

template <typename Values>
__global__ void __launch_bounds__(kThreads, 1)
    MergeRunsKernel(const typename Values::Bits* values, const int32_t* indices, int64_t rows,
                    int width, int k, bool prefetch, typename Values::Bits* out_values,
                    int32_t* out_indices) {
  using Bits = typename Values::Bits;
  extern __shared__ __align__(16) unsigned char shared_bytes[];
  Shared& s = *reinterpret_cast<Shared*>(shared_bytes);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    if (prefetch && threadIdx.x == 0 && row + gridDim.x < rows) {
      jax_topk::PrefetchRangeToL2(values + (row + gridDim.x) * width, width * sizeof(Bits));
      jax_topk::PrefetchRangeToL2(indices + (row + gridDim.x) * width, width * sizeof(int32_t));
    }
    // 1. Rank keys, then the run boundaries.
    const Bits* row_values = values + row * width;
    const int32_t* row_indices = indices + row * width;
#pragma unroll 8
    for (int place = threadIdx.x; place < width; place += kThreads)
      s.rank[place] = RankKey<Values>(row_values[place], row_indices[place]);
    if (threadIdx.x == 0) s.boundaries = 0;
    __syncthreads();
    for (int place = threadIdx.x + 1; place < width; place += kThreads) {
      if (s.rank[place] > s.rank[place - 1]) {
        const int slot = atomicAdd(&s.boundaries, 1);
        if (slot < kMaxRuns - 1) s.sequence_start[0][slot + 1] = place;
      }
    }
    __syncthreads();
    const int runs = s.boundaries + 1;
    if (runs > kMaxRuns) {
      if (threadIdx.x == 0) out_indices[row * k] = kNotRuns;
      __syncthreads();  // the next row rewrites `rank` and `boundaries`
      continue;
    }
    if (threadIdx.x == 0) {  // the run starts in place order (the atomics' order is not)
      int* const starts = s.sequence_start[0];
      starts[0] = 0;
      for (int r = 2; r < runs; ++r) {  // insertion sort of at most kMaxRuns - 1 places
        const int place = starts[r];
        int q = r;
        for (; q > 1 && starts[q - 1] > place; --q) starts[q] = starts[q - 1];
        starts[q] = place;
      }
      for (int r = 0; r < runs; ++r) {
        const int end = r + 1 < runs ? s.sequence_start[0][r + 1] : width;
        s.sequence_length[0][r] = min(k, end - s.sequence_start[0][r]);
      }
      s.sequences[0] = runs;
    }
    __syncthreads();
    // 2. The merge tree.
    int level = 0;
    for (; s.sequences[level % 2] > 1; ++level) {
      MergeLevel(s, level, k);
      __syncthreads();
    }
    // 3. The winners in rank order; no-candidate entries (R = 0) rank last.
    const int src = level % 2;
    const int length = s.sequence_length[src][0];
    const int start = s.sequence_start[src][0];
    for (int slot = threadIdx.x; slot < k; slot += kThreads) {
      uint64_t rank = 0;
      if (slot < length) rank = s.rank[level == 0 ? start + slot : s.places[src][start + slot]];
      out_values[row * k + slot] =
          rank != 0 ? Values::FromKey(static_cast<uint32_t>(rank >> 32)) : Values::kEmpty;
      out_indices[row * k + slot] =
          rank != 0 ? static_cast<int32_t>(~static_cast<uint32_t>(rank)) : jax_topk::kEmptySlot;
    }
    __syncthreads();  // the next row rewrites `rank` and the sequences
  }
}

// The host reference: candidates (column >= 0, not NaN) by key descending, column ascending.
template <typename Values>
void Reference(const std::vector<typename Values::Bits>& values,
               const std::vector<int32_t>& indices, int64_t rows, int width, int k,
               std::vector<typename Values::Bits>* want_values, std::vector<int32_t>* want_indices,
               std::vector<bool>* not_runs) {
  std::vector<std::pair<uint32_t, int32_t>> row;
  for (int64_t r = 0; r < rows; ++r) {
    row.clear();
    int runs = 1;
    uint64_t last = ~uint64_t{0};
    for (int j = 0; j < width; ++j) {
      const auto bits = values[r * width + j];
      const int32_t column = indices[r * width + j];
      const bool candidate = column >= 0 && !Values::IsNan(bits);
      const uint64_t rank =
          candidate ? (uint64_t{Values::Key(bits)} << 32) | static_cast<uint32_t>(~column) : 0;
      if (j > 0 && rank > last) ++runs;
      last = rank;
      if (candidate) row.push_back({Values::Key(bits), column});
    }
    (*not_runs)[r] = runs > kMaxRuns;
    std::sort(row.begin(), row.end(), [](const auto& x, const auto& y) {
      return x.first != y.first ? x.first > y.first : x.second < y.second;
    });
    for (int slot = 0; slot < k; ++slot) {
      const bool filled = slot < static_cast<int>(row.size());
      (*want_values)[r * k + slot] = filled ? Values::FromKey(row[slot].first) : Values::kEmpty;
      (*want_indices)[r * k + slot] = filled ? row[slot].second : jax_topk::kEmptySlot;
    }
  }
}

uint32_t FloatBits(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return bits;
}

template <typename Bits>
Bits BitsOf(float x) {
  const uint32_t bits = FloatBits(x);
  if constexpr (sizeof(Bits) == 4) {
    return bits;
  } else {
    return static_cast<Bits>(bits >> 16);  // bfloat16 by truncation: any bits do
  }
}

// Rows of `lists` lists of `per_list` candidates, each list in rank order as top_k(sorted=True)
// returns it; `kind` picks the values: 0 normal, 1 few distinct values (ties across and within
// lists), 2 constant, 3 lists part-filled (-1 slots with garbage values last), 4 NaN at lists'
// ends, 5 every list a copy of the first (equal (value, column) pairs), 6 unsorted (not runs).
template <typename Values>
void MakeRows(std::mt19937& rng, int64_t rows, int lists, int per_list, int kind,
              std::vector<typename Values::Bits>* values, std::vector<int32_t>* indices) {
  using Bits = typename Values::Bits;
  const int width = lists * per_list;
  values->resize(rows * width);
  indices->resize(rows * width);
  std::normal_distribution<float> normal;
  std::vector<std::pair<uint64_t, int>> order(per_list);
  for (int64_t r = 0; r < rows; ++r) {
    for (int l = 0; l < lists; ++l) {
      Bits* v = &(*values)[r * width + l * per_list];
      int32_t* c = &(*indices)[r * width + l * per_list];
      const int fill = kind == 3 ? static_cast<int>(rng() % (per_list + 1)) : per_list;
      for (int e = 0; e < per_list; ++e) {
        c[e] = l * 2 * per_list + 2 * e + static_cast<int>(rng() % 2);  // ascending in a shard
        const float x = kind == 1 ? static_cast<float>(rng() % 5) : kind == 2 ? 1.5f : normal(rng);
        v[e] = BitsOf<Bits>(x);
        if (kind == 4 && e >= per_list - 3) v[e] = BitsOf<Bits>(NAN);
        if (e >= fill) c[e] = -1, v[e] = BitsOf<Bits>(normal(rng));
        if (kind == 5 && l > 0) v[e] = v[e - l * per_list], c[e] = c[e - l * per_list];
      }
      if (kind == 6) continue;
      for (int e = 0; e < per_list; ++e) {
        const bool candidate = c[e] >= 0 && !Values::IsNan(v[e]);
        order[e] = {
            candidate ? (uint64_t{Values::Key(v[e])} << 32) | static_cast<uint32_t>(~c[e]) : 0, e};
      }
      std::stable_sort(order.begin(), order.end(),
                       [](const auto& x, const auto& y) { return x.first > y.first; });
      std::vector<Bits> v_sorted(per_list);
      std::vector<int32_t> c_sorted(per_list);
      for (int e = 0; e < per_list; ++e)
        v_sorted[e] = v[order[e].second], c_sorted[e] = c[order[e].second];
      std::copy(v_sorted.begin(), v_sorted.end(), v);
      std::copy(c_sorted.begin(), c_sorted.end(), c);
    }
  }
}

template <typename Values>
struct Run {
  using Bits = typename Values::Bits;
  Bits* values;
  int32_t* indices;
  Bits* out_values;
  int32_t* out_indices;
  int64_t rows;
  int width, k, grid;
  void Launch(bool prefetch, cudaStream_t stream = 0) const {
    MergeRunsKernel<Values><<<grid, kThreads, sizeof(Shared), stream>>>(
        values, indices, rows, width, k, prefetch, out_values, out_indices);
  }
};

// Runs one case on the device; returns the mismatching rows (and prints the first).
template <typename Values>
int64_t Check(const char* name, std::mt19937& rng, int64_t rows, int lists, int per_list, int k,
              int kind, int sms) {
  using Bits = typename Values::Bits;
  std::vector<Bits> values;
  std::vector<int32_t> indices;
  MakeRows<Values>(rng, rows, lists, per_list, kind, &values, &indices);
  const int width = lists * per_list;
  std::vector<Bits> want_values(rows * k), got_values(rows * k);
  std::vector<int32_t> want_indices(rows * k), got_indices(rows * k);
  std::vector<bool> not_runs(rows);
  Reference<Values>(values, indices, rows, width, k, &want_values, &want_indices, &not_runs);
  Run<Values> run{nullptr, nullptr, nullptr, nullptr,
                  rows,    width,   k,       static_cast<int>(std::min<int64_t>(rows, sms))};
  cudaMalloc(&run.values, values.size() * sizeof(Bits));
  cudaMalloc(&run.indices, indices.size() * 4);
  cudaMalloc(&run.out_values, rows * k * sizeof(Bits));
  cudaMalloc(&run.out_indices, rows * k * 4);
  cudaMemcpy(run.values, values.data(), values.size() * sizeof(Bits), cudaMemcpyHostToDevice);
  cudaMemcpy(run.indices, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice);
  run.Launch(false);
  cudaMemcpy(got_values.data(), run.out_values, rows * k * sizeof(Bits), cudaMemcpyDeviceToHost);
  cudaMemcpy(got_indices.data(), run.out_indices, rows * k * 4, cudaMemcpyDeviceToHost);
  const cudaError_t status = cudaDeviceSynchronize();
  int64_t bad = 0, flagged = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const bool marked = got_indices[r * k] == kNotRuns;
    flagged += marked;
    bool ok = marked == not_runs[r];
    if (ok && !marked) {
      ok = std::equal(&got_values[r * k], &got_values[(r + 1) * k], &want_values[r * k]) &&
           std::equal(&got_indices[r * k], &got_indices[(r + 1) * k], &want_indices[r * k]);
    }
    if (!ok && bad++ == 0) {
      int slot = 0;
      while (slot < k && got_indices[r * k + slot] == want_indices[r * k + slot]) ++slot;
      std::printf("MISMATCH %s row %lld slot %d: got column %d, want %d (not runs %d)\n", name,
                  static_cast<long long>(r), slot, got_indices[r * k + std::min(slot, k - 1)],
                  want_indices[r * k + std::min(slot, k - 1)], static_cast<int>(not_runs[r]));
    }
  }
  std::printf("check %-34s rows %5lld width %5d k %4d: %s, %lld rows not runs (%s)\n", name,
              static_cast<long long>(rows), width, k, bad == 0 ? "exact" : "WRONG",
              static_cast<long long>(flagged), cudaGetErrorString(status));
  cudaFree(run.values);
  cudaFree(run.indices);
  cudaFree(run.out_values);
  cudaFree(run.out_indices);
  return bad + (status != cudaSuccess);
}

float MedianUs(std::vector<float> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1000.0f;
}

template <typename Values>
float TimeUs(const Run<Values>& run, bool prefetch) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int repeat = 0; repeat < 21; ++repeat) {
    cudaEventRecord(start);
    run.Launch(prefetch);
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
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> ms;
  for (int repeat = 0; repeat < 21; ++repeat) {
    cudaEventRecord(start);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float elapsed;
    cudaEventElapsedTime(&elapsed, start, stop);
    if (repeat > 0) ms.push_back(elapsed);
  }
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (MedianUs(ms) * 1e-6);
}

template <typename Values>
void Bench(const char* dtype, std::mt19937& rng, int sms, double copy_rate) {
  using Bits = typename Values::Bits;
  const int64_t rows = 5536;
  const int lists = 8, per_list = 2048, k = 2048, width = lists * per_list;
  std::vector<Bits> values;
  std::vector<int32_t> indices;
  MakeRows<Values>(rng, rows, lists, per_list, 0, &values, &indices);
  Run<Values> run{nullptr, nullptr, nullptr, nullptr, rows, width, k, sms};
  cudaMalloc(&run.values, values.size() * sizeof(Bits));
  cudaMalloc(&run.indices, indices.size() * 4);
  cudaMalloc(&run.out_values, rows * k * sizeof(Bits));
  cudaMalloc(&run.out_indices, rows * k * 4);
  cudaMemcpy(run.values, values.data(), values.size() * sizeof(Bits), cudaMemcpyHostToDevice);
  cudaMemcpy(run.indices, indices.data(), indices.size() * 4, cudaMemcpyHostToDevice);
  const double floor_us = rows * width * (sizeof(Bits) + 4.0) / copy_rate * 1e6;
  for (const bool prefetch : {false, true}) {
    const float us = TimeUs(run, prefetch);
    std::printf("| %s | 5536 x 8 x 2048 sorted lists | %s | %.1f | %.1f | %.2fx |\n", dtype,
                prefetch ? "next row into L2" : "no prefetch", us, floor_us, us / floor_us);
  }
  cudaFree(run.values);
  cudaFree(run.indices);
  cudaFree(run.out_values);
  cudaFree(run.out_indices);
}

}  // namespace

int main() {
  int device = 0, sms = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaFuncSetAttribute(MergeRunsKernel<F32Values>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       sizeof(Shared));
  cudaFuncSetAttribute(MergeRunsKernel<Bf16Values>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       sizeof(Shared));
  std::mt19937 rng(15);
  int64_t bad = 0;
  const char* kinds[] = {"normal",      "few values",     "constant", "part-filled",
                         "NaN at ends", "repeated lists", "unsorted"};
  for (int kind = 0; kind < 7; ++kind) {
    struct Shape {
      int lists, per_list, k;
    };
    for (const Shape shape : {Shape{8, 2048, 2048}, Shape{8, 2048, 333}, Shape{3, 1999, 1500},
                              Shape{2, 5, 3}, Shape{16, 1024, 2048}, Shape{1, 2048, 7}}) {
      const auto [lists, per_list, k] = shape;
      char name[64];
      std::snprintf(name, sizeof(name), "f32 %s %dx%d", kinds[kind], lists, per_list);
      bad += Check<F32Values>(name, rng, 300, lists, per_list, k, kind, sms);
      std::snprintf(name, sizeof(name), "bf16 %s %dx%d", kinds[kind], lists, per_list);
      bad += Check<Bf16Values>(name, rng, 300, lists, per_list, k, kind, sms);
    }
  }
  const double copy_rate = CopyRate(size_t{1} << 30);
  std::printf("\ncopy rate %.2f TB/s (read + write)\n\n", copy_rate / 1e12);
  std::printf(
      "| dtype | shape | variant | us | read floor us | x floor |\n| --- | --- | --- | --- | --- | "
      "--- |\n");
  Bench<F32Values>("float32", rng, sms, copy_rate);
  Bench<Bf16Values>("bfloat16", rng, sms, copy_rate);
  std::printf("\n%s\n", bad == 0 ? "every check exact" : "MISMATCHES: see above");
  return bad == 0 ? 0 : 1;
}
