// The host side of tests/native/small_rows_check.cu: adversarial rows, the contract's reference
// (sort by ordered key descending, column ascending, with the shared rules of topk_common.h) and
// the brute force that checks it (pairwise ranks on decoded values, no ordered keys). Plain C++
// (cuda_fp16.h only for its host float -> half conversion), so it runs without a GPU.
#pragma once

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/topk_common.h"
#include "common/topk_problem.h"

namespace jax_topk {
namespace small_rows_check {

inline int ElementBytes(ScoreType type) {
  return type == ScoreType::kFloat32 ? 4 : 2;
}
inline const char* TypeName(ScoreType type) {
  switch (type) {
    case ScoreType::kFloat32:
      return "float32";
    case ScoreType::kBfloat16:
      return "bfloat16";
    case ScoreType::kFloat16:
      return "float16";
  }
  return "?";
}

// Element `column` of a row as raw bits, zero-extended.
inline uint32_t BitsAt(ScoreType type, const std::vector<uint8_t>& row_bytes, int64_t column) {
  if (type == ScoreType::kFloat32) {
    uint32_t bits;
    memcpy(&bits, row_bytes.data() + 4 * column, 4);
    return bits;
  }
  uint16_t bits;
  memcpy(&bits, row_bytes.data() + 2 * column, 2);
  return bits;
}

// ---- The host reference: the contract as written, with the shared key and NaN rules. ----

struct Selection {
  std::vector<int32_t>
      columns;  // k slots, kEmptySlot past the candidates (before any page transform)
  std::vector<uint32_t> value_bits;  // k slots, -inf's bits in empty slots
};

inline uint32_t ReferenceKey(ScoreType type, uint32_t bits, bool* nan) {
  switch (type) {
    case ScoreType::kFloat32:
      *nan = IsNanF32(bits);
      return OrderedKeyF32(bits);
    case ScoreType::kBfloat16:
      *nan = IsNanBf16(static_cast<uint16_t>(bits));
      return OrderedKeyBf16(static_cast<uint16_t>(bits));
    case ScoreType::kFloat16:
      *nan = IsNanF16(static_cast<uint16_t>(bits));
      return OrderedKeyBf16(static_cast<uint16_t>(bits));
  }
  return 0;
}
inline uint32_t NegInfBits(ScoreType type) {
  return type == ScoreType::kFloat32    ? kNegInfF32Bits
         : type == ScoreType::kBfloat16 ? kNegInfBf16Bits
                                        : kNegInfF16Bits;
}

inline Selection ReferenceSelect(ScoreType type, const std::vector<uint8_t>& row_bytes,
                                 int64_t length, int k, bool sorted) {
  struct Candidate {
    uint32_t key;
    int32_t column;
  };
  std::vector<Candidate> candidates;
  for (int64_t j = 0; j < length; ++j) {
    bool nan = false;
    const uint32_t key = ReferenceKey(type, BitsAt(type, row_bytes, j), &nan);
    if (!nan) candidates.push_back({key, static_cast<int32_t>(j)});
  }
  std::sort(candidates.begin(), candidates.end(), [](const Candidate& a, const Candidate& b) {
    return a.key != b.key ? a.key > b.key : a.column < b.column;
  });
  if (candidates.size() > static_cast<size_t>(k)) candidates.resize(k);
  if (!sorted) {
    std::sort(candidates.begin(), candidates.end(),
              [](const Candidate& a, const Candidate& b) { return a.column < b.column; });
  }
  Selection selection{std::vector<int32_t>(k, kEmptySlot),
                      std::vector<uint32_t>(k, NegInfBits(type))};
  for (size_t s = 0; s < candidates.size(); ++s) {
    selection.columns[s] = candidates[s].column;
    selection.value_bits[s] = BitsAt(type, row_bytes, candidates[s].column);
  }
  return selection;
}

// ---- The brute force the reference is checked against: no ordered keys, no sort. ----

inline double DecodeValue(ScoreType type, uint32_t bits) {
  if (type == ScoreType::kFloat32) {
    float value;
    memcpy(&value, &bits, 4);
    return value;
  }
  if (type == ScoreType::kBfloat16) {
    const uint32_t widened = bits << 16;
    float value;
    memcpy(&value, &widened, 4);
    return value;
  }
  const int sign = (bits >> 15) & 1;
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  double magnitude;
  if (exponent == 0x1F) {
    magnitude = mantissa != 0 ? std::numeric_limits<double>::quiet_NaN()
                              : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<double>(mantissa), -24);
  } else {
    magnitude = std::ldexp(static_cast<double>(1024 + mantissa), exponent - 25);
  }
  return sign ? -magnitude : magnitude;
}

// Does column a rank before column b? Larger value first, +0 before -0, then the lower column.
inline bool RanksBefore(double a, int64_t column_a, double b, int64_t column_b) {
  if (a != b) return a > b;
  if (std::signbit(a) != std::signbit(b)) return std::signbit(b);
  return column_a < column_b;
}

inline Selection BruteForceSelect(ScoreType type, const std::vector<uint8_t>& row_bytes,
                                  int64_t length, int k, bool sorted) {
  std::vector<double> values(length);
  for (int64_t j = 0; j < length; ++j) values[j] = DecodeValue(type, BitsAt(type, row_bytes, j));
  Selection selection{std::vector<int32_t>(k, kEmptySlot),
                      std::vector<uint32_t>(k, NegInfBits(type))};
  std::vector<int64_t> rank(length, -1);
  for (int64_t j = 0; j < length; ++j) {
    if (std::isnan(values[j])) continue;
    rank[j] = 0;
    for (int64_t i = 0; i < length; ++i) {
      if (i != j && !std::isnan(values[i]) && RanksBefore(values[i], i, values[j], j)) ++rank[j];
    }
  }
  int selected_before = 0;  // selected columns below j (sorted = false)
  for (int64_t j = 0; j < length; ++j) {
    if (rank[j] < 0 || rank[j] >= k) continue;
    const int64_t slot = sorted ? rank[j] : selected_before++;
    selection.columns[slot] = static_cast<int32_t>(j);
    selection.value_bits[slot] = BitsAt(type, row_bytes, j);
  }
  return selection;
}

// ---- Adversarial rows. ----

inline uint32_t FromFloat(ScoreType type, float value) {
  uint32_t bits;
  memcpy(&bits, &value, 4);
  if (type == ScoreType::kFloat32) return bits;
  if (type == ScoreType::kBfloat16) return bits >> 16;  // truncation: any bf16 will do
  const __half half = __float2half_rn(value);
  uint16_t half_bits;
  memcpy(&half_bits, &half, 2);
  return half_bits;
}

// Special bit patterns of each type: +/-0, +/-inf, NaNs of both signs (quiet, signalling,
// all-ones), the smallest and largest subnormals, the smallest normal, the largest finite.
inline std::vector<uint32_t> SpecialBits(ScoreType type) {
  if (type == ScoreType::kFloat32) {
    return {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u,
            0xFFC00000u, 0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu,
            0x00000001u, 0x80000001u, 0x007FFFFFu, 0x807FFFFFu, 0x00800000u,
            0x80800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, 0x3F800000u, 0xBF800000u};
  }
  if (type == ScoreType::kBfloat16) {
    return {0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF,
            0x0001, 0x8001, 0x007F, 0x807F, 0x0080, 0x8080, 0x7F7F, 0xFF7F, 0x3F80, 0xBF80};
  }
  return {0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7C01, 0xFC01, 0x7FFF, 0xFFFF,
          0x0001, 0x8001, 0x03FF, 0x83FF, 0x0400, 0x8400, 0x7BFF, 0xFBFF, 0x3C00, 0xBC00};
}

constexpr int kFamilies = 12;
const char* const kFamilyNames[kFamilies] = {
    "normal",    "random bits", "three values", "all equal",  "specials", "subnormals",
    "ascending", "descending",  "mostly -inf",  "mostly NaN", "all NaN",  "signed zeros"};

inline uint32_t FamilyBits(ScoreType type, int family, int64_t column, int64_t width,
                           uint32_t row_seed, std::mt19937& rng) {
  const uint32_t mask = type == ScoreType::kFloat32 ? 0xFFFFFFFFu : 0xFFFFu;
  const std::vector<uint32_t> specials = SpecialBits(type);
  const uint32_t neg_inf = NegInfBits(type);
  const uint32_t nan = specials[4];
  std::normal_distribution<float> normal;
  switch (family) {
    case 0:
      return FromFloat(type, normal(rng));
    case 1:
      return rng() & mask;
    case 2:
      return FromFloat(type, static_cast<float>(static_cast<int>(rng() % 3) - 1) * 0.5f);
    case 3:
      return FromFloat(type, static_cast<float>(row_seed % 7) - 3.0f);
    case 4:
      return specials[rng() % specials.size()];
    case 5: {  // subnormals and zeros of both signs
      const uint32_t sign = type == ScoreType::kFloat32 ? 0x80000000u : 0x8000u;
      const uint32_t subnormal_max = type == ScoreType::kFloat32    ? 0x007FFFFFu
                                     : type == ScoreType::kBfloat16 ? 0x007Fu
                                                                    : 0x03FFu;
      return (rng() % 4 == 0 ? 0u : rng() % (subnormal_max + 1)) | (rng() % 2 ? sign : 0u);
    }
    case 6:
      return FromFloat(type, static_cast<float>(column) - static_cast<float>(width) / 2);
    case 7:
      return FromFloat(type, static_cast<float>(width) / 2 - static_cast<float>(column));
    case 8:
      return rng() % 16 == 0 ? FromFloat(type, normal(rng)) : neg_inf;
    case 9:
      return rng() % 16 == 0 ? FromFloat(type, normal(rng)) : specials[4 + rng() % 6];
    case 10:
      return nan ^ (rng() % 2 ? (mask & ~(mask >> 1)) : 0u);  // +NaN or -NaN
    default:
      return specials[rng() % 2];  // +0 or -0
  }
}

// Lengths a row may carry: out of range both ways, around k, around the width.
inline int32_t LengthChoice(int index, int k, int64_t width, std::mt19937& rng) {
  const int64_t choices[] = {
      -1,        0,     1,         k - 1,     k,         k + 1,
      width - 1, width, width + 1, INT32_MAX, INT32_MIN, static_cast<int64_t>(rng() % (width + 1))};
  const int64_t length = choices[index % 12];
  return static_cast<int32_t>(std::clamp<int64_t>(length, INT32_MIN, INT32_MAX));
}

struct Case {
  ScoreType type = ScoreType::kFloat32;
  int64_t width = 256;
  int k = 8;
  bool sorted = true;
  bool with_values = true;
  bool with_lengths = true;
  bool unaligned_base = false;  // scores start one element past a 256-byte boundary
  bool valid_row_groups = false;
  bool page_table = false;
  int fewer_rows = 0;  // rows left off the end: the last block, or warp, holds fewer rows
};

struct HostProblem {
  Case c;
  int64_t rows = 0;
  std::vector<uint8_t> scores;  // [rows, width] of the element type
  std::vector<int32_t> lengths;
  std::vector<int32_t> num_valid_rows;
  int64_t rows_per_group = 1;
  std::vector<int32_t> page_table;
  int64_t table_count = 0, pages = 0;
  int32_t log2_page_size = 0;
  std::vector<int32_t> table_rows;
};

inline HostProblem MakeProblem(const Case& c, uint32_t seed) {
  HostProblem p;
  p.c = c;
  std::mt19937 rng(seed);
  p.rows = kFamilies * 12 - c.fewer_rows;  // every family with every length choice
  const int bytes = ElementBytes(c.type);
  p.scores.resize(p.rows * c.width * bytes);
  p.lengths.resize(p.rows);
  for (int64_t r = 0; r < p.rows; ++r) {
    const int family = static_cast<int>(r % kFamilies);
    p.lengths[r] = LengthChoice(static_cast<int>(r / kFamilies), c.k, c.width, rng);
    for (int64_t j = 0; j < c.width; ++j) {
      const uint32_t bits = FamilyBits(c.type, family, j, c.width, static_cast<uint32_t>(r), rng);
      memcpy(p.scores.data() + (r * c.width + j) * bytes, &bits, bytes);  // little-endian
    }
  }
  if (c.valid_row_groups) {
    p.rows_per_group = 16;
    const int32_t limits[] = {-3, 0, 5, 16, 100, 1, 15, 8, 12};
    for (int64_t g = 0; g < p.rows / p.rows_per_group; ++g)
      p.num_valid_rows.push_back(limits[g % 9]);
  }
  if (c.page_table) {
    p.log2_page_size = 4;
    p.pages = (c.width + 15) / 16;
    p.table_count = p.rows / 3 + 1;
    p.page_table.resize(p.table_count * p.pages);
    for (auto& page : p.page_table) page = static_cast<int32_t>(rng() % 4096) - 8;  // some negative
    p.table_rows.resize(p.rows);
    for (int64_t r = 0; r < p.rows; ++r) {
      const int64_t choices[] = {-5, 0, r % p.table_count, p.table_count - 1, p.table_count + 7};
      p.table_rows[r] = static_cast<int32_t>(choices[r % 5]);
    }
  }
  return p;
}

// The full contract for one problem: valid rows, lengths, the selection, the page transform.
inline void ReferenceOutputs(const HostProblem& p, std::vector<int32_t>* out,
                             std::vector<uint32_t>* value_bits) {
  const Case& c = p.c;
  const int bytes = ElementBytes(c.type);
  out->assign(p.rows * c.k, kEmptySlot);
  value_bits->assign(p.rows * c.k, NegInfBits(c.type));
  std::vector<uint8_t> row_bytes(c.width * bytes);
  for (int64_t r = 0; r < p.rows; ++r) {
    if (!RowIsValid(r, p.num_valid_rows.empty() ? nullptr : p.num_valid_rows.data(),
                    p.rows_per_group)) {
      continue;
    }
    const int64_t length = c.with_lengths ? ClampLength(p.lengths[r], c.width) : c.width;
    memcpy(row_bytes.data(), p.scores.data() + r * c.width * bytes, row_bytes.size());
    const Selection s = ReferenceSelect(c.type, row_bytes, length, c.k, c.sorted);
    const int32_t* table_row =
        c.page_table
            ? p.page_table.data() + TableRowFor(r, p.table_rows.data(), p.table_count) * p.pages
            : nullptr;
    for (int slot = 0; slot < c.k; ++slot) {
      const int32_t column = s.columns[slot];
      (*out)[r * c.k + slot] =
          column == kEmptySlot ? kEmptySlot : PageTransform(column, table_row, p.log2_page_size);
      (*value_bits)[r * c.k + slot] = s.value_bits[slot];
    }
  }
}

inline std::string Describe(const Case& c) {
  char text[256];
  snprintf(text, sizeof(text),
           "%s width=%lld k=%d sorted=%d values=%d lengths=%d unaligned=%d groups=%d pages=%d "
           "fewer_rows=%d",
           TypeName(c.type), static_cast<long long>(c.width), c.k, c.sorted, c.with_values,
           c.with_lengths, c.unaligned_base, c.valid_row_groups, c.page_table, c.fewer_rows);
  return text;
}

// ---- --reference-only: the reference against the brute force, on the host. ----

// Calls visit(c) for every score type, each width and each k of kCheckedKs; c's other fields
// are the defaults, for the caller to vary.
constexpr int kCheckedKs[] = {1, 2, 7, 8, 9, 16, 31, 32, 33, 48, 63, 64};
template <typename Visit>
inline void ForEachShape(std::initializer_list<int64_t> widths, Visit visit) {
  for (ScoreType type : {ScoreType::kFloat32, ScoreType::kBfloat16, ScoreType::kFloat16}) {
    for (int64_t width : widths) {
      for (int k : kCheckedKs) {
        Case c;
        c.type = type;
        c.width = width;
        c.k = k;
        visit(c);
      }
    }
  }
}

inline int CheckReference() {
  long long passed = 0, failed = 0;
  uint32_t seed = 1;
  ForEachShape({1, 7, 33, 64, 100, 255, 256, 257, 300}, [&](Case c) {
    for (int sorted = 0; sorted < 2; ++sorted) {
      c.sorted = sorted;
      const HostProblem p = MakeProblem(c, seed++);
      const int bytes = ElementBytes(c.type);
      std::vector<uint8_t> row_bytes(c.width * bytes);
      for (int64_t r = 0; r < p.rows; ++r) {
        const int64_t length = ClampLength(p.lengths[r], c.width);
        memcpy(row_bytes.data(), p.scores.data() + r * c.width * bytes, row_bytes.size());
        const Selection a = ReferenceSelect(c.type, row_bytes, length, c.k, c.sorted);
        const Selection b = BruteForceSelect(c.type, row_bytes, length, c.k, c.sorted);
        if (a.columns == b.columns && a.value_bits == b.value_bits) {
          ++passed;
        } else if (++failed <= 10) {
          printf("FAIL reference vs brute force: %s row %lld (%s, length %lld)\n",
                 Describe(c).c_str(), static_cast<long long>(r), kFamilyNames[r % kFamilies],
                 static_cast<long long>(length));
        }
      }
    }
  });
  printf("reference vs brute force: %lld rows PASS, %lld FAIL\n", passed, failed);
  return failed == 0 ? 0 : 1;
}

}  // namespace small_rows_check
}  // namespace jax_topk
