// merge_fine_buckets.cuh's fine buckets run on the host (host_simt.h: a std::thread a CUDA
// thread) by one 512-thread block, against a plain count: codes counted, placed by bucket, and
// each bucket's start and end read back, for code sets whose buckets are spread at random,
// close in slot order (sorted runs: what rank-order lists' kept codes and a warp's places
// are), crowded into one bucket (over and at the crowding limit), at the two ends of the
// range, and empty, one and 4096 codes. The word layout is checked whole: every count lands in its own bucket and Zero() leaves every stored word zero. A
// layout whose words collide makes wrong starts, which place codes past `placed`: build with
// AddressSanitizer so that is reported, not silent (a mismatch is printed otherwise).
// Build and run (seconds on two cores):
//   g++ -std=c++20 -O1 -g -fsanitize=address -pthread -Icuda -I. -Ibenches/probes/host_stub \
//       benches/probes/merge_fine_on_host.cc -o /tmp/mfoh
//   /tmp/mfoh
#include "benches/probes/host_simt.h"
// host_simt.h first: the kernel header's __device__ and friends come from it, and its
// <cuda_runtime.h> is host_stub's empty one.
#include <cstdio>
#include <random>

#include "kernels/merge_fine_buckets.cuh"

namespace {

constexpr int kThreads = 512;
constexpr int kSlots = 8;  // merge_in_registers.cuh's kListSlots: 4096 codes
constexpr int kCodes = kThreads * kSlots;
constexpr uint32_t kMaxBucket = 64;
using Fine = jax_topk::merge_registers::FineBuckets<kThreads>;
constexpr int kStored = sizeof(Fine::words) / sizeof(uint32_t);  // every word, unused ones too

struct Outcome {
  bool placed_ok;
  std::vector<uint64_t> placed;
  std::vector<uint32_t> starts, ends;  // a bucket's Start() and End() after the placing
  bool zero_after;                     // every stored word zero after Zero()
};

Outcome RunBlock(const std::vector<uint64_t>& codes, int shift, uint32_t limit,
                 bool only_straddling) {
  const int n = static_cast<int>(codes.size());
  Outcome out{false, std::vector<uint64_t>(kCodes, ~uint64_t{0}),
              std::vector<uint32_t>(Fine::kBins), std::vector<uint32_t>(Fine::kBins), true};
  const size_t placed_at = (sizeof(Fine) + 15) / 16 * 16;
  host_simt::Launch(1, kThreads, placed_at + kCodes * sizeof(uint64_t), [&] {
    Fine& fine = *reinterpret_cast<Fine*>(DynamicShared());
    uint64_t* placed = reinterpret_cast<uint64_t*>(DynamicShared() + placed_at);
    fine.Zero();  // over the launch's 0xA5 bytes
    __syncthreads();
    const auto code_of = [&](int slot) { return codes[slot]; };
    const bool ok = jax_topk::merge_registers::PlaceByBucket<kSlots>(
        fine, n, ~0u, code_of, shift, limit, only_straddling, kMaxBucket, placed);
    if (threadIdx.x == 0) out.placed_ok = ok;
    if (ok) {
      for (int j = 0; j < kSlots; ++j) {
        const int place = j * kThreads + static_cast<int>(threadIdx.x);
        if (place < n) out.placed[place] = placed[place];
      }
      for (int b = threadIdx.x; b < Fine::kBins; b += kThreads) {
        out.starts[b] = fine.Start(b);
        out.ends[b] = fine.End(b, n);
      }
    } else {  // the words must be zero again already
      for (int w = threadIdx.x; w < kStored; w += kThreads)
        if (fine.words[w] != 0) out.zero_after = false;
    }
    __syncthreads();
    fine.Zero();
    __syncthreads();
    for (int w = threadIdx.x; w < kStored; w += kThreads)
      if (fine.words[w] != 0) out.zero_after = false;
  });
  return out;
}

// Compares a block's outcome with a plain count; prints and returns the mismatches.
int Check(const char* name, const std::vector<uint64_t>& codes, int shift, uint32_t limit,
          bool only_straddling) {
  const int n = static_cast<int>(codes.size());
  std::vector<uint32_t> counts(Fine::kBins, 0);
  for (uint64_t c : codes) ++counts[c >> shift];
  std::vector<uint32_t> starts(Fine::kBins, 0);
  for (int b = 1; b < Fine::kBins; ++b) starts[b] = starts[b - 1] + counts[b - 1];
  uint32_t largest = 0;
  for (int b = 0; b < Fine::kBins; ++b) {
    const bool ranked = starts[b] < limit && (!only_straddling || starts[b] + counts[b] > limit);
    if (ranked) largest = std::max(largest, counts[b]);
  }
  const Outcome got = RunBlock(codes, shift, limit, only_straddling);
  int bad = 0;
  const auto fail = [&](const char* what, int at) {
    if (bad++ < 3) std::printf("%s: %s at %d\n", name, what, at);
  };
  if (got.placed_ok != (largest <= kMaxBucket)) fail("fallback decision", largest);
  if (!got.zero_after) fail("words not zero", 0);
  if (got.placed_ok) {
    for (int b = 0; b < Fine::kBins; ++b) {
      if (got.starts[b] != starts[b]) fail("start", b);
      if (got.ends[b] != starts[b] + counts[b]) fail("end", b);
    }
    std::vector<uint64_t> want(codes), placed(got.placed.begin(), got.placed.begin() + n);
    std::sort(want.begin(), want.end());
    for (int p = 0; p < n; ++p) {  // grouped by bucket, buckets ascending
      if (p < n && (placed[p] >> shift) != (want[p] >> shift)) fail("placed bucket", p);
    }
    std::sort(placed.begin(), placed.end());
    if (placed != want) fail("placed codes", 0);
  }
  std::printf("%-44s n=%4d limit=%4u %s: %s\n", name, n, limit,
              only_straddling ? "straddling" : "ranked    ", bad ? "MISMATCH" : "exact");
  return bad;
}

}  // namespace

int main() {
  std::mt19937_64 rng(17);
  constexpr int kShift = 20;  // codes of 34 bits, buckets their top 14
  const auto code_in = [&](uint64_t bucket) {
    return bucket << kShift | (rng() & ((uint64_t{1} << kShift) - 1));
  };
  int bad = 0;
  const auto both = [&](const char* name, const std::vector<uint64_t>& codes) {
    const uint32_t limit = static_cast<uint32_t>(std::min<size_t>(codes.size(), 2048));
    bad += Check(name, codes, kShift, limit, false);
    bad += Check(name, codes, kShift, limit, true);
  };
  for (int n : {0, 1, 2800, kCodes}) {
    std::vector<uint64_t> spread(n), runs(n);
    for (auto& c : spread) c = code_in(rng() % Fine::kBins);
    both("spread at random", spread);
    // Sorted runs of 32 close codes from 8 lists: the slot order of rank-order lists.
    for (int i = 0; i < n; ++i) runs[i] = code_in((i / 256) * 64 + (i % 256) / 8 + rng() % 3);
    both("close in slot order (rank-order lists)", runs);
    std::vector<uint64_t> ascending(spread);
    std::sort(ascending.begin(), ascending.end());
    both("ascending (a warp's places)", ascending);
  }
  for (int n : {64, 65, 300}) {  // one crowded bucket: at the limit, and past it
    std::vector<uint64_t> crowded(n);
    for (auto& c : crowded) c = code_in(777);
    both("one bucket", crowded);
  }
  std::vector<uint64_t> ends;
  for (int i = 0; i < 120; ++i) ends.push_back(code_in(i % 2 ? Fine::kBins - 1 - i % 5 : i % 7));
  both("the two ends of the range", ends);
  std::printf("\n%s\n", bad == 0 ? "every check exact" : "MISMATCHES: see above");
  return bad == 0 ? 0 : 1;
}
