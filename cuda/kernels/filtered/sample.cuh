// The sample: cutoffs that keep about kRetention * k candidates of a row. A regular 1/s sample of
// whole lines of 32 elements (s >= kMinSampleStride, the phase depending on the row so that
// consecutive rows read different lines), two histograms of its keys, and the sampled ranks
// that leave ~k (primary, 22 bits) and ~2k + slack (secondary, 11 bits) row items above them.
//
// Contract: SampleCutoffs is called by every thread of the block with block-uniform arguments.
// It uses s.hist through the selection's histograms (barriers inside) and raises
// s.sample_largest (zeroed when the job was published; read only after a later barrier).
// Rows of at most kSharedCandidates columns take no sample: their cutoffs keep everything.
#pragma once

#include "kernels/filtered/selection.cuh"

namespace jax_topk {
namespace {

// This thread's share of a regular sample of whole lines; `positions` gets the sampled count.
// A line is kSampleLineElems elements of any width (a 128-byte line of float32, half of one
// of a 16-bit row).
template <class Elements>
__device__ __forceinline__ SampleSource LoadSample(const typename Elements::Storage* row,
                                                   int length, int64_t row_index, int& positions) {
  const int lines = length / kSampleLineElems + (length % kSampleLineElems != 0);
  const int wanted_stride = lines / kSampleLines + (lines % kSampleLines != 0);
  const int stride = wanted_stride > kMinSampleStride ? wanted_stride : kMinSampleStride;
  // Consecutive rows sample different lines.
  const int phase = static_cast<int>(row_index % stride);
  const int sampled_lines = (lines - phase - 1) / stride + 1;  // lines > phase: length > 8 lines
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  SampleSource sample;
#pragma unroll
  for (int j = 0; j < kSampleLinesPerWarp; ++j) {
    const int line = warp + kWarpsPerBlock * j;
    // line * stride < lines.
    const int64_t col = int64_t{phase + line * stride} * kSampleLineElems + lane;
    sample.values[j] = line < sampled_lines && col < length
                           ? WidenedValue<Elements>(__ldg(row + col))
                           : __uint_as_float(kNanBits);
  }
  positions = sampled_lines * kSampleLineElems;
  return sample;
}

// Also pulls columns [prefetch_begin, prefetch_end) (up to kPrefetchAhead<Elements> of them) into
// L2, behind the sample's loads so that these are not queued after the prefetches, and records the
// sample's largest key in s.sample_largest (zeroed when the job started).
template <class Elements>
__device__ __forceinline__ Cutoffs SampleCutoffs(SharedStorage& s,
                                                 const typename Elements::Storage* row, int length,
                                                 int64_t row_index, int k, int rank_slack,
                                                 int prefetch_begin, int prefetch_end) {
  if (length <= kSharedCandidates) {  // short rows are kept whole
    PrefetchToL2(row, prefetch_begin, prefetch_end, kPrefetchAhead<Elements>);
    return {0, 0};
  }
  int positions = 0;
  const SampleSource sample = LoadSample<Elements>(row, length, row_index, positions);
  PrefetchToL2(row, prefetch_begin, prefetch_end, kPrefetchAhead<Elements>);
  uint32_t largest = 0;
#pragma unroll
  for (int j = 0; j < kSampleLinesPerWarp; ++j) {
    const uint32_t bits = __float_as_uint(sample.values[j]);
    if (!IsNanF32(bits)) largest = max(largest, OrderedKeyF32(bits));
  }
  largest = __reduce_max_sync(kFullMask, largest);
  if (threadIdx.x % kWarpSize == 0) atomicMax(&s.sample_largest, largest);  // read after a barrier
  ProbeStamp(s, kPhaseSampleLoads);  // thread 0: once warp 0's lines have come
  // Sampled rank whose key leaves ~kRetention * k row items above it (positions <= 4096). The
  // row's top k put a Poisson count of mean e = k * positions / length into the sample, so a
  // slack of 4 sqrt(e) + 8 leaves an under-filled primary below ~1e-6 for any e; the caller's
  // slack caps it (measured at k = 2048, e ~ 64). At small k (vocabulary sampling: e ~ 1.4 at
  // k = 50 over 152064) a fixed 24 kept ~20 k values (benches/NOTES.md "small-k slack").
  const int64_t expected = (kRetention * static_cast<int64_t>(k) * positions + length - 1) / length;
  const int spread_slack = static_cast<int>(ceilf(4.0f * sqrtf(static_cast<float>(expected)))) + 8;
  const int64_t primary_rank = expected + min(rank_slack, spread_slack);
  const int64_t secondary_rank = kSecondaryFactor * primary_rank + kRankSlack;
  DigitHistogram(s, sample, KeyOfValue{}, 0, 0, 0);
  const BinSearch coarse =
      FindBins(s, static_cast<uint32_t>(primary_rank), static_cast<uint32_t>(secondary_rank));
  ProbeStamp(s, kPhaseSampleCoarse);
  if (primary_rank > coarse.total) return {0, 0};
  const uint32_t secondary = secondary_rank > coarse.total ? 0 : coarse.b.bin << DigitShift(0);
  // Refine the primary within its coarse bin with the next 11 bits of the sampled keys.
  const uint32_t coarse_prefix = coarse.a.bin << DigitShift(0);
  DigitHistogram(s, sample, KeyOfValue{}, coarse_prefix, DigitMask(0) << DigitShift(0), 1);
  const BinFound fine = FindBins(s, static_cast<uint32_t>(primary_rank) - coarse.a.above, 0).a;
  return {coarse_prefix | (fine.bin << DigitShift(1)), secondary};
}

}  // namespace
}  // namespace jax_topk
