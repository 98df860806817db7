// Selection: the exact top-k of any source (sources.cuh) with ties to the lowest columns, by
//   1. a histogram of the first 11-bit radix digit (or, for kept candidates, 2048 bins relative
//      to the cutoff that kept them, whose k-th bin one warp usually ranks directly),
//   2. a search of the bins for the rank (one block scan),
//   3. compaction of the rank's bin into s.work.frontier, then the next digits over it alone,
//   4. a second selection over the k-th key's columns, which gives the tie quota,
//   5. PutWinners: the winners marked in s.work.bitmap or gathered into s.work.selected
//      (winners.cuh writes them out in order).
// SelectCandidates is the entry point for a buffer of (value bits, column) candidates, as a
// fused indexer or a merge kernel holds them; SelectRow is the exact route over a row.
//
// Contract: every function is called by every thread of the block, with block-uniform
// arguments, and ends with a barrier: its results (returned, or in s.work) are then visible to
// all. They own s.hist (zero on entry and exit), s.found, s.warp_sums, s.frontier_count,
// s.selected_count and s.work; they read s.candidates and the workspace slice only through the
// source. Usage, in a kernel of kThreadsPerBlock threads whose dynamic shared memory is a
// SharedStorage s with s.hist zeroed once at its start (as TopkFilteredKernel does), holding n
// candidates (value bits, column), the first kSharedCandidates in s.candidates and the rest in a
// global buffer `more`:
//   const CandidateSource candidates{s.candidates, kSharedCandidates, more, n};
//   const Selection selection =
//       SelectCandidates(s, candidates, k, /*cutoff=*/0, /*largest=*/0, WinnersTo::kSelected);
//   const int m = PutWinners(s, candidates, selection, WinnersTo::kSelected, /*columns=*/0);
//   // m = min(k, n) winners in s.work.selected; WriteWinners (winners.cuh) writes them to
//   // output row s.job.row.
#pragma once

#include <type_traits>

#include "kernels/filtered/probe.cuh"
#include "kernels/filtered/sources.cuh"
#include "kernels/topk_scan.cuh"

namespace jax_topk {
namespace {

// Warp-level helpers. All lanes of the warp call them.

// Adds `counted` lanes to hist[digit]; a warp whose lanes share one digit adds once (rows of
// equal values would otherwise serialise on one shared-memory address).
__device__ __forceinline__ void AddToHistogram(uint32_t* hist, uint32_t digit, bool counted) {
  const uint32_t voters = __ballot_sync(kFullMask, counted);
  if (voters == 0) return;
  const int leader = __ffs(voters) - 1;
  const uint32_t leader_digit = __shfl_sync(kFullMask, digit, leader);
  if (__all_sync(kFullMask, !counted || digit == leader_digit)) {
    if (static_cast<int>(threadIdx.x % kWarpSize) == leader)
      atomicAdd(&hist[leader_digit], __popc(voters));
  } else if (counted) {
    atomicAdd(&hist[digit], 1u);
  }
}

// A slot of a shared append counter for each lane that wants one: one atomic per warp.
__device__ __forceinline__ int WarpReserve(int* counter, bool want) {
  const uint32_t wanting = __ballot_sync(kFullMask, want);
  if (wanting == 0) return 0;
  const int lane = threadIdx.x % kWarpSize;
  const int leader = __ffs(wanting) - 1;
  int base = 0;
  if (lane == leader) base = atomicAdd(counter, __popc(wanting));
  base = __shfl_sync(kFullMask, base, leader);
  return base + __popc(wanting & ((1u << lane) - 1u));
}

// Radix selection. Every function is called by all threads with block-uniform arguments.

// Histogram of digit `digit` of the projected values whose higher digits equal `prefix`.
template <class Source, class Project>
__device__ __forceinline__ void DigitHistogram(SharedStorage& s, const Source& source,
                                               const Project& project, uint32_t prefix,
                                               uint32_t prefix_mask, int digit) {
  const int shift = DigitShift(digit);
  const uint32_t digit_mask = DigitMask(digit);
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    uint32_t value = 0;
    const bool counted = valid && project(bits, col, value) && (value & prefix_mask) == prefix;
    if constexpr (Source::kRepeats) {
      AddToHistogram(s.hist, (value >> shift) & digit_mask, counted);
    } else if (counted) {  // a bounded number of items: conflicts cost less than aggregating
      atomicAdd(&s.hist[(value >> shift) & digit_mask], 1u);
    }
  });
  __syncthreads();
}

// The bins holding the rank_a-th and rank_b-th largest histogram items (a rank of 0 or past the
// total finds nothing), and the total.
struct BinSearch {
  BinFound a;
  BinFound b;
  uint32_t total;
};
// The bin a thread's j-th count stands for: thread 0 owns the top bins.
__device__ __forceinline__ int BinOf(int j) {
  return kDigitBins - 1 - (static_cast<int>(threadIdx.x) * kBinsPerThread + j);
}
// The search over a histogram held as each thread's counts of its bins (BinOf).
__device__ __forceinline__ BinSearch SearchBins(SharedStorage& s,
                                                const uint32_t (&counts)[kBinsPerThread],
                                                uint32_t rank_a, uint32_t rank_b) {
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) mine += counts[j];
  uint32_t total;
  uint32_t above = BlockExclusiveSum(s.warp_sums, mine, total);
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    const uint32_t bin = BinOf(j);
    if (above < rank_a && rank_a <= above + counts[j]) s.found[0] = {bin, above, counts[j]};
    if (above < rank_b && rank_b <= above + counts[j]) s.found[1] = {bin, above, counts[j]};
    above += counts[j];
  }
  __syncthreads();
  return {s.found[0], s.found[1], total};
}
// The search over s.hist, which it leaves zeroed for its next use.
__device__ __forceinline__ BinSearch FindBins(SharedStorage& s, uint32_t rank_a, uint32_t rank_b) {
  uint32_t counts[kBinsPerThread];
#pragma unroll
  for (int j = 0; j < kBinsPerThread; ++j) {
    counts[j] = s.hist[BinOf(j)];
    s.hist[BinOf(j)] = 0;
  }
  return SearchBins(s, counts, rank_a, rank_b);
}

// Calls put(position, candidate) for the candidates that keep(bits, col), at positions 0, 1, ...
// taken from *counter. In rounds of one entry a thread: the round's ballot places each member in
// its warp, and one atomic per warp and batch reserves the warp's places (no scan, no re-read).
// Every thread of the block calls it.
template <class Keep, class Put>
__device__ __forceinline__ void CompactCandidates(const CandidateSource& source, int* counter,
                                                  const Keep& keep, const Put& put) {
  constexpr int kBatch = 8;
  const int lane = threadIdx.x % kWarpSize;
  const uint32_t lanes_below = (1u << lane) - 1u;
  for (int base = 0; base < source.count; base += kBatch * kThreadsPerBlock) {  // block-uniform
    uint2 c[kBatch];
    uint32_t ballots[kBatch];
    int warp_total = 0;
    // Block-uniform, the usual case.
    if (base + kBatch * kThreadsPerBlock <= source.shared_capacity) {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {  // all loads first, with no branch to the slice
        const int entry = base + kThreadsPerBlock * i + static_cast<int>(threadIdx.x);
        c[i] = entry < source.count ? source.shared[entry] : make_uint2(kNanBits, 0);
      }
    } else {
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        const int entry = base + kThreadsPerBlock * i + static_cast<int>(threadIdx.x);
        c[i] = entry < source.count ? source.Get(entry) : make_uint2(kNanBits, 0);
      }
    }
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      const int entry = base + kThreadsPerBlock * i + static_cast<int>(threadIdx.x);
      ballots[i] = __ballot_sync(
          kFullMask, entry < source.count && keep(c[i].x, static_cast<int32_t>(c[i].y)));
      warp_total += __popc(ballots[i]);
    }
    int warp_base = 0;
    if (lane == 0 && warp_total > 0) warp_base = atomicAdd(counter, warp_total);
    int position = __shfl_sync(kFullMask, warp_base, 0);
#pragma unroll
    for (int i = 0; i < kBatch; ++i) {
      if (ballots[i] & (1u << lane)) put(position + __popc(ballots[i] & lanes_below), c[i]);
      position += __popc(ballots[i]);
    }
  }
}

// Puts value(bits, col) of the candidates that are members into the frontier (frontier_count
// of them).
template <class Member, class Value>
__device__ __forceinline__ void CompactCandidatesToFrontier(SharedStorage& s,
                                                            const CandidateSource& source,
                                                            const Member& member,
                                                            const Value& value) {
  if (threadIdx.x == 0) s.frontier_count = 0;
  __syncthreads();
  CompactCandidates(source, &s.frontier_count, member, [&](int position, uint2 c) {
    s.work.frontier[position] = value(c.x, static_cast<int32_t>(c.y));
  });
  __syncthreads();
}

// Copies the projected values of the group `prefix` into the frontier.
template <class Source, class Project>
__device__ __forceinline__ void CompactGroup(SharedStorage& s, const Source& source,
                                             const Project& project, uint32_t prefix,
                                             uint32_t prefix_mask) {
  if constexpr (std::is_same_v<Source, CandidateSource>) {
    const auto member = [&](uint32_t bits, int32_t col) {
      uint32_t value = 0;
      return project(bits, col, value) && (value & prefix_mask) == prefix;
    };
    const auto projected = [&](uint32_t bits, int32_t col) {
      uint32_t value = 0;
      project(bits, col, value);
      return value;
    };
    CompactCandidatesToFrontier(s, source, member, projected);
    return;
  }
  if (threadIdx.x == 0) s.frontier_count = 0;
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    uint32_t value = 0;
    const bool member = valid && project(bits, col, value) && (value & prefix_mask) == prefix;
    const int position = WarpReserve(&s.frontier_count, member);
    if (member) s.work.frontier[position] = value;
  });
  __syncthreads();
}

// The rank-th largest projected value, how many items of it are needed to make up `rank`
// (quota) and how many there are (group). Fewer than rank items take part: all = true.
struct RankValue {
  uint32_t value;
  int quota;
  int group;
  bool all;
  int total;                  // the items taking part
  int put = -1;               // >= 0: the winners are put already (GatherOneKeyBin, MarkOneKeyBin)
  uint32_t column_limit = 0;  // ... and the last of them of `value` is at this column
};
template <class Source, class Project>
__device__ __forceinline__ RankValue FindRankValue(SharedStorage& s, const Source& source,
                                                   const Project& project, int rank) {
  DigitHistogram(s, source, project, 0, 0, 0);
  const BinSearch first = FindBins(s, rank, 0);
  if (first.total < static_cast<uint32_t>(rank))
    return {0, 0, 0, true, static_cast<int>(first.total)};
  uint32_t prefix = first.a.bin << DigitShift(0);
  uint32_t prefix_mask = DigitMask(0) << DigitShift(0);
  uint32_t remaining = rank - first.a.above;  // the groups above are committed
  uint32_t group = first.a.count;
  // The boundary group usually is a small part of the source: later digits look at it alone.
  const bool compacted = group <= kFrontierCapacity;
  if (compacted) CompactGroup(s, source, project, prefix, prefix_mask);
  const FrontierSource frontier{s.work.frontier, static_cast<int>(group)};
  for (int digit = 1; digit < kNumDigits; ++digit) {
    if (compacted) {
      DigitHistogram(s, frontier, AsProjected{}, prefix, prefix_mask, digit);
    } else {
      DigitHistogram(s, source, project, prefix, prefix_mask, digit);
    }
    const BinFound found = FindBins(s, remaining, 0).a;
    remaining -= found.above;
    group = found.count;
    prefix |= found.bin << DigitShift(digit);
    prefix_mask |= DigitMask(digit) << DigitShift(digit);
  }
  return {prefix, static_cast<int>(remaining), static_cast<int>(group), false,
          static_cast<int>(first.total)};
}

// Where a selection's winners go: marked in s.work.bitmap (a bit for each of the columns
// [0, columns), columns <= kBitmapColumns; WriteWinners reads them out in column order), or
// gathered into s.work.selected (value bits and column, in no particular order).
enum class WinnersTo { kSelected, kBitmap };

// The most members a rank by the whole block takes (RankInBlock): a thread a member.
constexpr int kBlockRankMembers = 256;
static_assert(kBlockRankMembers <= kThreadsPerBlock, "a thread a member");

// 2048 bins relative to a cutoff (> 0), spanning [cutoff, largest]: keys past largest fall in the
// last bin, keys below the cutoff (kept under a +-0 threshold) in the first. A rank in a bin of
// a few candidates (or of one key) is then ranked directly. Every route ranks the members of the
// bin by their own keys, so the first and last bins, wider than the others, settle one as well
// (`edges`; the probe's kProbeOldBinEdges keeps them out, as before): a 16-bit row's k-th key is
// often the cutoff's own, in bin 0 (benches/NOTES.md "bf16-bin0").
struct RelativeBins {
  uint32_t cutoff;
  int shift;
  __device__ __forceinline__ RelativeBins(uint32_t cutoff_key, uint32_t largest)
      : cutoff(cutoff_key) {
    const uint32_t quotient = (largest - cutoff) / kLastBin;  // the smallest shift leaving largest
    shift = quotient == 0 ? 0 : 32 - __clz(quotient);         // below the last bin
  }
  // Whether bins relative to cutoff can settle a rank (else the radix digits do).
  __device__ __forceinline__ static bool Usable(uint32_t cutoff_key, uint32_t largest) {
    return cutoff_key != 0 && largest > cutoff_key;
  }
  __device__ __forceinline__ uint32_t operator()(uint32_t key) const {
    if (key < cutoff) return 0u;
    const uint32_t bin = (key - cutoff) >> shift;
    return bin < kLastBin ? bin : kLastBin;
  }
  // Whether a bin may settle a rank: any bin with edges, else not the first or last.
  __device__ __forceinline__ static bool MaySettle(const BinFound& found, bool edges) {
    return edges || (found.bin != 0 && found.bin != kLastBin);
  }
  // Whether the rank's bin, of `count` candidates, is one a warp ranks.
  __device__ __forceinline__ static bool Settles(const BinFound& found, bool edges) {
    return MaySettle(found, edges) && found.count <= kWarpSize;
  }
  // Whether it is one the block ranks (a 16-bit row's k-th key alone often has 33-200 ties).
  __device__ __forceinline__ static bool SettlesInBlock(const BinFound& found, bool edges) {
    return MaySettle(found, edges) && found.count > kWarpSize && found.count <= kBlockRankMembers;
  }
  static constexpr uint32_t kLastBin = kDigitBins - 1;
};

// Lane l of a warp holds member l (key, col) of a group of `group` <= 32 members: how many members
// have a greater key, an equal key and (kColumns) an equal key at a lower column.
struct WarpRank {
  int greater;
  int equal;
  int equal_before;
};
template <bool kColumns>
__device__ __forceinline__ WarpRank RankInWarp(uint32_t key, uint32_t col, int group) {
  int greater = 0;
  int equal = 0;
  int equal_before = 0;
  for (int other = 0; other < group; ++other) {
    const uint32_t other_key = __shfl_sync(kFullMask, key, other);
    // Both branches spelled out: this order compiles to the measured code.
    if constexpr (kColumns) {
      const uint32_t other_col = __shfl_sync(kFullMask, col, other);
      greater += other_key > key;
      equal += other_key == key;
      equal_before += other_key == key && other_col < col;
    } else {
      greater += other_key > key;
      equal += other_key == key;
    }
  }
  return {greater, equal, equal_before};
}

// The rank-th largest of the `count` values in s.work.frontier (0 < rank <= count <=
// kBlockRankMembers) as {value, how many of it make up rank, how many equal it}: thread t counts
// the members above member t and equal to it, and the first member of the rank's value answers.
// A few hundred members cost each of their threads one pass over them, where two more radix
// digits cost four histogram searches and their barriers. A barrier follows.
__device__ __forceinline__ BinFound RankInBlock(SharedStorage& s, int count, int rank) {
  const int t = static_cast<int>(threadIdx.x);
  if (t < count) {
    const uint32_t mine = s.work.frontier[t];
    int greater = 0;
    int equal = 0;
    int equal_before = 0;
    for (int other = 0; other < count; ++other) {
      const uint32_t value = s.work.frontier[other];
      greater += value > mine;
      equal += value == mine;
      equal_before += value == mine && other < t;
    }
    if (equal_before == 0 && greater < rank && rank <= greater + equal) {
      s.found[0] = {mine, static_cast<uint32_t>(rank - greater), static_cast<uint32_t>(equal)};
    }
  }
  __syncthreads();
  return s.found[0];
}

// Whether the candidates of relative bin `bin` all share one key, and which: a pass over them
// with a warp's minimum and maximum folded into shared words (s.work.frontier, dead here). A
// crowded bin of one key (a 16-bit row's tie group at the k-th key: JAX's bfloat16 normal rows
// hold ~1000 there) then needs no radix digits. A barrier follows.
__device__ __forceinline__ bool OneKeyInBin(SharedStorage& s, const CandidateSource& source,
                                            const RelativeBins& bins, uint32_t bin, uint32_t& key) {
  uint32_t* const lowest = &s.work.frontier[0];
  uint32_t* const highest = &s.work.frontier[1];
  if (threadIdx.x == 0) {
    *lowest = 0xFFFFFFFFu;
    *highest = 0u;
  }
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t, bool valid) {
    const uint32_t item_key = OrderedKeyF32(bits);
    const bool member = valid && bins(item_key) == bin;
    const uint32_t low = __reduce_min_sync(kFullMask, member ? item_key : 0xFFFFFFFFu);
    const uint32_t high = __reduce_max_sync(kFullMask, member ? item_key : 0u);
    if (threadIdx.x % kWarpSize == 0 && low <= high) {
      atomicMin(lowest, low);
      atomicMax(highest, high);
    }
  });
  __syncthreads();
  key = *lowest;
  const bool one = *lowest == *highest;
  __syncthreads();  // read before the frontier's next use
  return one;
}

// The quota-th lowest column (quota >= 1) of the candidates of key `key`, all in [0, columns)
// with columns <= kBitmapColumns: their columns marked in s.work.bitmap (dead here), then
// counted in column order by one block scan of each thread's 16 words. For tie groups too large
// to rank member by member; a barrier follows.
__device__ __forceinline__ uint32_t NthColumnOfKey(SharedStorage& s, const CandidateSource& source,
                                                   uint32_t key, int quota, int columns) {
  constexpr int kWordsPerThread = kBitmapColumns / 32 / kThreadsPerBlock;
  const int words = (columns + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreadsPerBlock) s.work.bitmap[w] = 0;
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    if (valid && OrderedKeyF32(bits) == key) atomicOr(&s.work.bitmap[col / 32], 1u << (col % 32));
  });
  __syncthreads();
  const int first_word = static_cast<int>(threadIdx.x) * kWordsPerThread;
  uint32_t mine = 0;
#pragma unroll
  for (int j = 0; j < kWordsPerThread; ++j)
    mine += first_word + j < words ? __popc(s.work.bitmap[first_word + j]) : 0u;
  uint32_t total;
  const uint32_t before = BlockExclusiveSum(s.warp_sums, mine, total);
  const uint32_t wanted = static_cast<uint32_t>(quota);
  if (before < wanted && wanted <= before + mine) {  // one thread: the quota-th bit is in its words
    uint32_t need = wanted - before;
    for (int j = 0; j < kWordsPerThread; ++j) {
      uint32_t word = s.work.bitmap[first_word + j];
      const uint32_t here = __popc(word);
      if (need <= here) {
        for (; need > 1; --need) word &= word - 1;  // drop the lower set bits
        s.found[0].bin = static_cast<uint32_t>((first_word + j) * 32 + __ffs(word) - 1);
        break;
      }
      need -= here;
    }
  }
  __syncthreads();
  return s.found[0].bin;
}

// Adds this block's candidates to s.hist in relative bins; a barrier follows. (A warp's lanes of
// one bin matched and added once, `__match_any_sync`, measured slower: benches/NOTES.md
// "bf16-bin0".)
__device__ __forceinline__ void RelativeHistogram(SharedStorage& s, const CandidateSource& source,
                                                  const RelativeBins& bins) {
  source.ForEach([&](uint32_t bits, int32_t, bool valid) {
    if (valid) atomicAdd(&s.hist[bins(OrderedKeyF32(bits))], 1u);
  });
  __syncthreads();
}

// Rows of up to kGatherBitmapColumns columns keep a bitmap of a crowded bin's columns in the upper
// half of s.work, above s.work.selected, so that one pass can fill both.
constexpr int kGatherBitmapAt = 2 * kMaxK;  // in s.work.frontier's words
constexpr int kGatherBitmapWordsPerThread =
    (kFrontierCapacity - kGatherBitmapAt) / kThreadsPerBlock;
constexpr int kGatherBitmapColumns = kGatherBitmapWordsPerThread * kThreadsPerBlock * 32;
static_assert(kGatherBitmapWordsPerThread % 4 == 0, "whole uint4 loads a thread");
static_assert(kGatherBitmapAt * sizeof(uint32_t) == sizeof(SharedStorage::work.selected),
              "the bitmap right above the winners");

// Folds this warp's members' lowest and highest key into s.bin_key_range (set to
// (0xFFFFFFFF, 0) before the pass): after it, one key exactly when the two are equal.
__device__ __forceinline__ void FoldBinKeyRange(SharedStorage& s, bool member, uint32_t key) {
  const uint32_t low = __reduce_min_sync(kFullMask, member ? key : 0xFFFFFFFFu);
  const uint32_t high = __reduce_max_sync(kFullMask, member ? key : 0u);
  if (threadIdx.x % kWarpSize == 0 && low <= high) {
    atomicMin(&s.bin_key_range.x, low);
    atomicMax(&s.bin_key_range.y, high);
  }
}

// This thread's kGatherBitmapWordsPerThread words of a crowded bin's members' bitmap of `words`
// words (those past it read as 0: only `words` were zeroed), from word `first`, and their members.
struct MemberWords {
  uint32_t word[kGatherBitmapWordsPerThread];
  int first;
  uint32_t count;
};
__device__ __forceinline__ MemberWords LoadMemberWords(const uint32_t* bitmap, int words) {
  MemberWords mine;
  mine.first = static_cast<int>(threadIdx.x) * kGatherBitmapWordsPerThread;
  mine.count = 0;
#pragma unroll
  for (int q = 0; q < kGatherBitmapWordsPerThread / 4; ++q) {
    const uint4 four = *reinterpret_cast<const uint4*>(&bitmap[mine.first + 4 * q]);
    mine.word[4 * q + 0] = four.x;
    mine.word[4 * q + 1] = four.y;
    mine.word[4 * q + 2] = four.z;
    mine.word[4 * q + 3] = four.w;
  }
#pragma unroll
  for (int j = 0; j < kGatherBitmapWordsPerThread; ++j) {
    if (mine.first + j >= words) mine.word[j] = 0;
    mine.count += __popc(mine.word[j]);
  }
  return mine;
}

// A crowded relative bin (`found`, holding the rank-th key) settled with the winners gathered into
// s.work.selected, for rows of up to kGatherBitmapColumns columns: one pass over the candidates
// takes the bin's lowest and highest key, marks its members' columns in a bitmap and gathers the
// candidates of the bins above it (all winners: found.above of them); when the bin holds one key,
// one block scan of the bitmap appends its rank - found.above lowest columns. A bfloat16 row's
// usual route (its k-th key has ~1000 ties: benches/NOTES.md "bf16-bin0"), in one pass where
// OneKeyInBin, NthColumnOfKey and GatherWinners take three. Returns the rank value with
// `put` = rank, or with put = -1 when the bin holds more than one key (then only s.work has
// changed). A barrier follows.
__device__ __forceinline__ RankValue GatherOneKeyBin(SharedStorage& s,
                                                     const CandidateSource& source,
                                                     const RelativeBins& bins,
                                                     const BinFound& found, int rank, int total,
                                                     int columns) {
  uint32_t* const bitmap = s.work.frontier + kGatherBitmapAt;
  const int words = (columns + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreadsPerBlock) bitmap[w] = 0;
  if (threadIdx.x == 0) {
    s.selected_count = 0;
    s.bin_key_range = make_uint2(0xFFFFFFFFu, 0u);
  }
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    const uint32_t key = OrderedKeyF32(bits);
    const uint32_t bin = bins(key);
    const bool member = valid && bin == found.bin;
    const bool above = valid && bin > found.bin;
    FoldBinKeyRange(s, member, key);
    if (member) atomicOr(&bitmap[col / 32], 1u << (col % 32));
    const int position = WarpReserve(&s.selected_count, above);
    if (above) {  // found.above < rank <= kMaxK of them
      s.work.selected.bits[position] = bits;
      s.work.selected.col[position] = static_cast<uint32_t>(col);
    }
  });
  __syncthreads();
  const uint2 key_range = s.bin_key_range;
  if (key_range.x != key_range.y) return {0, 0, 0, false, total};  // block-uniform
  // This thread's words: its members are the bin's before + 1, before + 2, ... in column order.
  const MemberWords mine = LoadMemberWords(bitmap, words);
  uint32_t members;
  uint32_t before = BlockExclusiveSum(s.warp_sums, mine.count, members);
  const uint32_t quota = static_cast<uint32_t>(rank) - found.above;  // 1 .. found.count
  const uint32_t key_bits = BitsFromOrderedKeyF32(key_range.x);
#pragma unroll
  for (int j = 0; j < kGatherBitmapWordsPerThread; ++j) {
    for (uint32_t word = mine.word[j]; word != 0 && before < quota; word &= word - 1, ++before) {
      const uint32_t col = static_cast<uint32_t>(mine.first + j) * 32 + __ffs(word) - 1;
      s.work.selected.bits[found.above + before] = key_bits;
      s.work.selected.col[found.above + before] = col;
      if (before + 1 == quota) s.found[0].bin = col;  // the last winning column of the key
    }
  }
  __syncthreads();
  return {key_range.x, static_cast<int>(quota), static_cast<int>(found.count), false, total,
          rank,        s.found[0].bin};
}

// GatherOneKeyBin's twin for winners marked in s.work.bitmap (unsorted results without values),
// rows of up to kGatherBitmapColumns columns: the winners' bitmap in the lower half of s.work,
// the crowded bin's member columns in the upper half. One pass over the candidates takes the
// bin's lowest and highest key, marks the bins above it as winners and the bin's members apart;
// when the bin holds one key, one block scan of the members' bitmap adds its rank - found.above
// lowest columns to the winners. Where the bin was block-ranked, its tie quota ranked by the
// block again and every winner marked in a third pass (benches/NOTES.md "one-key bins
// marked"). Returns the rank value with `put` = rank, or put = -1 when the bin holds more than
// one key (then only s.work has changed: MarkWinners clears what was marked). A barrier follows.
__device__ __forceinline__ RankValue MarkOneKeyBin(SharedStorage& s, const CandidateSource& source,
                                                   const RelativeBins& bins, const BinFound& found,
                                                   int rank, int total, int columns) {
  uint32_t* const winners = s.work.bitmap;
  uint32_t* const members = s.work.frontier + kGatherBitmapAt;
  static_assert(kGatherBitmapColumns / 32 <= kGatherBitmapAt, "the winners below the members");
  const int words = (columns + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreadsPerBlock) winners[w] = members[w] = 0;
  if (threadIdx.x == 0) s.bin_key_range = make_uint2(0xFFFFFFFFu, 0u);
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    const uint32_t key = OrderedKeyF32(bits);
    const uint32_t bin = bins(key);
    const bool member = valid && bin == found.bin;
    FoldBinKeyRange(s, member, key);
    if (member) atomicOr(&members[col / 32], 1u << (col % 32));
    if (valid && bin > found.bin) atomicOr(&winners[col / 32], 1u << (col % 32));
  });
  __syncthreads();
  const uint2 key_range = s.bin_key_range;
  if (key_range.x != key_range.y) return {0, 0, 0, false, total};  // block-uniform
  // This thread's words: its members are the bin's before + 1, before + 2, ... in column order;
  // it alone writes the winners' words it owns from here on.
  const MemberWords mine = LoadMemberWords(members, words);
  uint32_t in_bin;
  uint32_t before = BlockExclusiveSum(s.warp_sums, mine.count, in_bin);
  const uint32_t quota = static_cast<uint32_t>(rank) - found.above;  // 1 .. found.count
#pragma unroll
  for (int j = 0; j < kGatherBitmapWordsPerThread; ++j) {
    uint32_t won = 0;
    for (uint32_t word = mine.word[j]; word != 0 && before < quota; word &= word - 1, ++before) {
      won |= word & (~word + 1);  // the lowest member left
      if (before + 1 == quota) {  // the last winning column of the key
        s.found[0].bin = static_cast<uint32_t>(mine.first + j) * 32 + __ffs(word) - 1;
      }
    }
    if (won != 0) winners[mine.first + j] |= won;
  }
  __syncthreads();
  return {key_range.x, static_cast<int>(quota), static_cast<int>(found.count), false, total,
          rank,        s.found[0].bin};
}

// The rank-th largest key of candidates kept by `cutoff`, given the sample's largest key: one
// histogram in relative bins usually leaves the k-th key in a bin of a few candidates, which one
// warp ranks directly. Otherwise the three-digit selection (the answer never depends on the
// sample, only the work does). A crowded bin of one key puts the winners as it settles: gathered
// into s.work.selected (`to` = kSelected, GatherOneKeyBin) or marked in s.work.bitmap (kBitmap,
// MarkOneKeyBin), the result's `put`. Bins no wider than the keys' step
// (`key_step_bits`: 16-bit rows) hold one key each (but +-0, and the last bin), so there a bin
// of 33-256 is gathered too, rather than ranked by the block and then gathered again
// (benches/NOTES.md "one-key bins of 16-bit rows"); the block ranks it if it holds more keys
// after all (+-0, or the last bin's keys past the sample's largest).
__device__ __forceinline__ RankValue FindCandidateRankValue(SharedStorage& s,
                                                            const CandidateSource& source, int rank,
                                                            uint32_t cutoff, uint32_t largest,
                                                            WinnersTo to, int key_step_bits) {
  if (!RelativeBins::Usable(cutoff, largest)) return FindRankValue(s, source, KeyOfValue{}, rank);
  const RelativeBins relative_bin(cutoff, largest);
  RelativeHistogram(s, source, relative_bin);
  const BinSearch first = FindBins(s, rank, 0);
  if (first.total < static_cast<uint32_t>(rank))
    return {0, 0, 0, true, static_cast<int>(first.total)};
  const uint32_t group_bin = first.a.bin;
  const int group = static_cast<int>(first.a.count);
  const bool crowded = !ProbeOn(s, kProbeOldSelection);  // bins of 33+ without radix digits
  const bool edges = crowded && !ProbeOn(s, kProbeOldBinEdges);
  const bool gathers = to == WinnersTo::kSelected && s.job.length <= kGatherBitmapColumns;
  const bool marks = to == WinnersTo::kBitmap && s.job.length <= kGatherBitmapColumns &&
                     !ProbeOn(s, kProbeOldMarks);
  const bool by_block = crowded && RelativeBins::SettlesInBlock(first.a, edges);
  const bool gather_first =
      by_block && (gathers || marks) && key_step_bits > 0 && relative_bin.shift <= key_step_bits;
  if (!RelativeBins::Settles(first.a, edges) && (!by_block || gather_first)) {
    uint32_t key = 0;
    const bool may_settle = crowded && RelativeBins::MaySettle(first.a, edges);
    if (may_settle && gathers) {
      const RankValue kth = GatherOneKeyBin(s, source, relative_bin, first.a, rank,
                                            static_cast<int>(first.total), s.job.length);
      if (kth.put >= 0) {
        ProbeCount(s, kCountOneKeyBin);
        ProbeCount(s, kCountGatheredBin);
        return kth;
      }
    } else if (may_settle && marks) {
      const RankValue kth = MarkOneKeyBin(s, source, relative_bin, first.a, rank,
                                          static_cast<int>(first.total), s.job.length);
      if (kth.put >= 0) {
        ProbeCount(s, kCountOneKeyBin);
        ProbeCount(s, kCountMarkedBin);
        return kth;
      }
    } else if (may_settle && OneKeyInBin(s, source, relative_bin, group_bin, key)) {
      ProbeCount(s, kCountOneKeyBin);
      return {key, rank - static_cast<int>(first.a.above), group, false,
              static_cast<int>(first.total)};
    }
    if (!gather_first) {  // else the block ranks the bin's several keys below
      ProbeCount(s, kCountDigitRank);
      return FindRankValue(s, source, KeyOfValue{}, rank);
    }
  }
  ProbeCount(s, by_block ? kCountBlockRank : kCountWarpRank);
  const int remaining = rank - static_cast<int>(first.a.above);
  CompactCandidatesToFrontier(
      s, source,
      [&](uint32_t bits, int32_t) { return relative_bin(OrderedKeyF32(bits)) == group_bin; },
      [](uint32_t bits, int32_t) { return OrderedKeyF32(bits); });
  if (by_block) {
    const BinFound kth = RankInBlock(s, group, remaining);  // {key, quota, group}
    return {kth.bin, static_cast<int>(kth.above), static_cast<int>(kth.count), false,
            static_cast<int>(first.total)};
  }
  if (threadIdx.x < kWarpSize) {  // each member counts the members above it and equal to it
    const int lane = threadIdx.x;
    const uint32_t key = lane < group ? s.work.frontier[lane] : 0u;
    const WarpRank r = RankInWarp<false>(key, 0, group);
    const bool holds_rank =
        lane < group && r.greater < remaining && remaining <= r.greater + r.equal;
    if (lane == __ffs(__ballot_sync(kFullMask, holds_rank)) - 1) {
      s.found[0] = {key, static_cast<uint32_t>(remaining - r.greater),
                    static_cast<uint32_t>(r.equal)};
    }
  }
  __syncthreads();
  const BinFound kth = s.found[0];  // {key, quota, group}
  return {kth.bin, static_cast<int>(kth.above), static_cast<int>(kth.count), false,
          static_cast<int>(first.total)};
}

// Whether an item wins: a key above kth_key, or equal to it at a column <= column_limit.
struct Wins {
  uint32_t kth_key;
  uint32_t column_limit;
  __device__ __forceinline__ bool operator()(uint32_t bits, int32_t col) const {
    const uint32_t key = OrderedKeyF32(bits);
    return key > kth_key || (key == kth_key && static_cast<uint32_t>(col) <= column_limit);
  }
};

// Marks the winners' columns, all in [base, base + span) with base a multiple of 32, in
// s.work.bitmap (zeroed first: the frontier it aliases is dead); bit c stands for column base + c.
template <class Source>
__device__ __forceinline__ void MarkWinners(SharedStorage& s, const Source& source,
                                            const Wins& wins, int base, int span) {
  const int words = (span + 31) / 32;
  for (int w = threadIdx.x; w < words; w += kThreadsPerBlock) s.work.bitmap[w] = 0;
  __syncthreads();
  source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
    if (valid && wins(bits, col)) atomicOr(&s.work.bitmap[(col - base) / 32], 1u << (col % 32));
  });
  __syncthreads();
}

// Puts the winners in s.work.selected, in no particular order. Returns how many.
template <class Source>
__device__ __forceinline__ int GatherWinners(SharedStorage& s, const Source& source,
                                             const Wins& wins) {
  if (threadIdx.x == 0) s.selected_count = 0;
  __syncthreads();
  if constexpr (std::is_same_v<Source, CandidateSource>) {
    CompactCandidates(source, &s.selected_count, wins, [&](int position, uint2 c) {
      if (position < kMaxK) {
        s.work.selected.bits[position] = c.x;
        s.work.selected.col[position] = c.y;
      }
    });
  } else {
    source.ForEach([&](uint32_t bits, int32_t col, bool valid) {
      const bool won = valid && wins(bits, col);
      const int position = WarpReserve(&s.selected_count, won);
      if (won && position < kMaxK) {
        s.work.selected.bits[position] = bits;
        s.work.selected.col[position] = static_cast<uint32_t>(col);
      }
    });
  }
  __syncthreads();
  return min(s.selected_count, kMaxK);
}

// A settled selection: which items win (the k-th key and the last winning column of it) and
// how many do.
struct Selection {
  Wins wins;
  bool all;   // at most k valid items: all of them win
  int total;  // the valid items
  int k;
  int put = -1;  // >= 0: that many winners are put where `to` says already
  __device__ __forceinline__ int Count() const { return all ? total : k; }  // min(k, total)
};

// Given the k-th value of a source (kth), settles the tie quota: the lowest columns of the k-th
// key win.
template <class Source>
__device__ __forceinline__ Selection SettleTies(SharedStorage& s, const Source& source, int k,
                                                const RankValue& kth) {
  if (kth.put >= 0) return {{kth.value, kth.column_limit}, false, kth.total, k, kth.put};
  Wins wins{0, 0};  // kth.all: every valid key is above 0
  if (!kth.all) {
    wins = {kth.value, 0xFFFFFFFFu};
    if (kth.quota < kth.group) {
      // The quota-th lowest column of the k-th key: the quota-th largest complemented column.
      bool by_block = false;
      bool by_bitmap = false;
      if constexpr (std::is_same_v<Source, CandidateSource>) {
        const bool old = ProbeOn(s, kProbeOldSelection);
        by_block = kth.group <= kBlockRankMembers && !old;
        by_bitmap = !by_block && !old && s.job.length <= kBitmapColumns;
      }
      ProbeCount(s, by_block ? kCountTieBlock : by_bitmap ? kCountTieBitmap : kCountTieDigits);
      if constexpr (std::is_same_v<Source, CandidateSource>) {
        if (by_bitmap) {
          wins.column_limit = NthColumnOfKey(s, source, kth.value, kth.quota, s.job.length);
          return {wins, kth.all, kth.total, k};
        }
        if (by_block) {
          const uint32_t key = kth.value;
          CompactCandidatesToFrontier(
              s, source, [&](uint32_t bits, int32_t) { return OrderedKeyF32(bits) == key; },
              [](uint32_t, int32_t col) { return ~static_cast<uint32_t>(col); });
          wins.column_limit = ~RankInBlock(s, kth.group, kth.quota).bin;
          return {wins, kth.all, kth.total, k};
        }
      }
      wins.column_limit = ~FindRankValue(s, source, LowColumnOfTie{kth.value}, kth.quota).value;
    }
  }
  return {wins, kth.all, kth.total, k};
}

// The exact top-k of a buffer of candidates (ties to the lowest columns): the entry point for
// any kernel that holds (value bits, column) pairs, however it found them. `cutoff` is the
// ordered key that kept them (0: none; > 0 lets the relative bins work, given `largest`, the
// largest key the caller expects, e.g. the sample's): the answer never depends on either, only
// the work does. PutWinners then puts the winners where the caller wants them: `to`, where they
// go, must be what the caller then passes PutWinners, since a crowded bin of one key puts them
// there as it settles them (gathered into s.work.selected or marked in s.work.bitmap: the
// selection's `put`, which PutWinners returns as it is).
// `key_step_bits`: the candidates' distinct keys of one sign lie at least 2^key_step_bits apart
// (16-bit rows widened: elements.cuh kKeyStepBits; 0 says nothing).
__device__ __forceinline__ Selection SelectCandidates(SharedStorage& s,
                                                      const CandidateSource& candidates, int k,
                                                      uint32_t cutoff, uint32_t largest,
                                                      WinnersTo to, int key_step_bits = 0) {
  return SettleTies(s, candidates, k,
                    FindCandidateRankValue(s, candidates, k, cutoff, largest, to, key_step_bits));
}

// The exact top-k of a row read from global memory (the exact route).
template <class Elements>
__device__ __forceinline__ Selection SelectRow(SharedStorage& s, const RowSource<Elements>& row,
                                               int k) {
  return SettleTies(s, row, k, FindRankValue(s, row, KeyOfValue{}, k));
}

// Puts the winners of `selection` (over the same source) where `to` says; returns how many.
template <class Source>
__device__ __forceinline__ int PutWinners(SharedStorage& s, const Source& source,
                                          const Selection& selection, WinnersTo to, int columns) {
  if (selection.put >= 0) return selection.put;  // gathered or marked as `to` says
  if (to == WinnersTo::kSelected) return GatherWinners(s, source, selection.wins);
  MarkWinners(s, source, selection.wins, 0, columns);
  return selection.Count();
}

}  // namespace
}  // namespace jax_topk
