// small_rows_check: a standalone check of topk_small_rows (LaunchTopkSmallRows) outside JAX.
// 1. Adversarial rows (ties, +/-0, +/-inf, NaN of both signs, subnormals, random bits, sorted
//    runs) with lengths -1, 0, 1, k-1, k, k+1, n-1, n, n+1 and beyond, for float32, bfloat16 and
//    float16, aligned and unaligned rows, with and without values, lengths, valid-row groups and
//    a page table: every output word against a host reference (sort by key desc, column asc).
// 2. Timings (cudaEvents, inputs rotated over more than 3x the L2) of [4096, 256] and
//    [65536, 256], k = 8, against the read floor of a device-to-device copy measured alongside.
// --reference-only makes no CUDA call: it checks the host reference against a brute force
//    (each candidate's rank counted pairwise on decoded values), so it runs on a machine
//    without a GPU.
// Build from the repository root:
//   nvcc -std=c++17 --expt-relaxed-constexpr -O3 -gencode=arch=compute_90a,code=sm_90a -Icuda \
//     tests/native/small_rows_check.cu cuda/kernels/topk_small_rows.cu -o small_rows_check
// Exit status 0 when every compared case passes.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

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
#include "kernels/topk_cuda.h"

namespace jax_topk {
namespace {

int ElementBytes(ScoreType type) { return type == ScoreType::kFloat32 ? 4 : 2; }
const char* TypeName(ScoreType type) {
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
uint32_t BitsAt(ScoreType type, const std::vector<uint8_t>& row_bytes, int64_t column) {
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
  std::vector<int32_t> columns;  // k slots, kEmptySlot past the candidates (before any page transform)
  std::vector<uint32_t> value_bits;  // k slots, -inf's bits in empty slots
};

uint32_t ReferenceKey(ScoreType type, uint32_t bits, bool* nan) {
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
uint32_t NegInfBits(ScoreType type) {
  return type == ScoreType::kFloat32    ? kNegInfF32Bits
         : type == ScoreType::kBfloat16 ? kNegInfBf16Bits
                                        : kNegInfF16Bits;
}

Selection ReferenceSelect(ScoreType type, const std::vector<uint8_t>& row_bytes, int64_t length,
                          int k, bool sorted) {
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

double DecodeValue(ScoreType type, uint32_t bits) {
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
bool RanksBefore(double a, int64_t column_a, double b, int64_t column_b) {
  if (a != b) return a > b;
  if (std::signbit(a) != std::signbit(b)) return std::signbit(b);
  return column_a < column_b;
}

Selection BruteForceSelect(ScoreType type, const std::vector<uint8_t>& row_bytes, int64_t length,
                           int k, bool sorted) {
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

uint32_t FromFloat(ScoreType type, float value) {
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
std::vector<uint32_t> SpecialBits(ScoreType type) {
  if (type == ScoreType::kFloat32) {
    return {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u,
            0x7F800001u, 0xFF800001u, 0x7FFFFFFFu, 0xFFFFFFFFu, 0x00000001u, 0x80000001u,
            0x007FFFFFu, 0x807FFFFFu, 0x00800000u, 0x80800000u, 0x7F7FFFFFu, 0xFF7FFFFFu,
            0x3F800000u, 0xBF800000u};
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
    "normal",   "random bits", "three values", "all equal", "specials",  "subnormals",
    "ascending", "descending", "mostly -inf",  "mostly NaN", "all NaN",  "signed zeros"};

uint32_t FamilyBits(ScoreType type, int family, int64_t column, int64_t width, uint32_t row_seed,
                    std::mt19937& rng) {
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
int32_t LengthChoice(int index, int k, int64_t width, std::mt19937& rng) {
  const int64_t choices[] = {-1,        0,         1,         k - 1,    k,
                             k + 1,     width - 1, width,     width + 1, INT32_MAX,
                             INT32_MIN, static_cast<int64_t>(rng() % (width + 1))};
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

HostProblem MakeProblem(const Case& c, uint32_t seed) {
  HostProblem p;
  p.c = c;
  std::mt19937 rng(seed);
  p.rows = kFamilies * 12;  // every family with every length choice
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
    for (int64_t g = 0; g < p.rows / p.rows_per_group; ++g) p.num_valid_rows.push_back(limits[g % 9]);
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
void ReferenceOutputs(const HostProblem& p, std::vector<int32_t>* out,
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
        c.page_table ? p.page_table.data() +
                           TableRowFor(r, p.table_rows.data(), p.table_count) * p.pages
                     : nullptr;
    for (int slot = 0; slot < c.k; ++slot) {
      const int32_t column = s.columns[slot];
      (*out)[r * c.k + slot] =
          column == kEmptySlot ? kEmptySlot : PageTransform(column, table_row, p.log2_page_size);
      (*value_bits)[r * c.k + slot] = s.value_bits[slot];
    }
  }
}

std::string Describe(const Case& c) {
  char text[256];
  snprintf(text, sizeof(text),
           "%s width=%lld k=%d sorted=%d values=%d lengths=%d unaligned=%d groups=%d pages=%d",
           TypeName(c.type), static_cast<long long>(c.width), c.k, c.sorted, c.with_values,
           c.with_lengths, c.unaligned_base, c.valid_row_groups, c.page_table);
  return text;
}

// ---- --reference-only: the reference against the brute force, on the host. ----

// Calls visit(c) for every score type, each width and each k of kCheckedKs; c's other fields
// are the defaults, for the caller to vary.
constexpr int kCheckedKs[] = {1, 2, 7, 8, 9, 16, 31, 32};
template <typename Visit>
void ForEachShape(std::initializer_list<int64_t> widths, Visit visit) {
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

int CheckReference() {
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

// ---- The GPU checks. ----

#define CHECK_CUDA(call)                                                                    \
  do {                                                                                      \
    const cudaError_t status = (call);                                                      \
    if (status != cudaSuccess) {                                                            \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status)); \
      exit(2);                                                                              \
    }                                                                                       \
  } while (0)

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  if (host.empty()) return nullptr;
  T* device = nullptr;
  CHECK_CUDA(cudaMalloc(&device, host.size() * sizeof(T)));
  CHECK_CUDA(cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return device;
}

constexpr int kGuardWords = 64;  // written past each output; any change is an out-of-bounds store
constexpr uint32_t kGuardBits = 0x5A5A5A5Au;

// Runs one case on the GPU; returns the number of rows that differ from the reference.
int64_t CheckCase(const Case& c, uint32_t seed) {
  const HostProblem p = MakeProblem(c, seed);
  const int bytes = ElementBytes(c.type);
  // The scores end exactly at the allocation's end (so compute-sanitizer sees any overread);
  // an unaligned case starts them one element into it.
  const size_t score_bytes = p.scores.size();
  const size_t offset = c.unaligned_base ? bytes : 0;
  uint8_t* scores_allocation = nullptr;
  CHECK_CUDA(cudaMalloc(&scores_allocation, score_bytes + offset));
  CHECK_CUDA(cudaMemcpy(scores_allocation + offset, p.scores.data(), score_bytes,
                        cudaMemcpyHostToDevice));
  int32_t* lengths = c.with_lengths ? DeviceCopy(p.lengths) : nullptr;
  int32_t* num_valid_rows = DeviceCopy(p.num_valid_rows);
  int32_t* page_table = DeviceCopy(p.page_table);
  int32_t* table_rows = DeviceCopy(p.table_rows);
  const size_t out_words = p.rows * c.k;
  int32_t* out = nullptr;
  uint8_t* values = nullptr;
  CHECK_CUDA(cudaMalloc(&out, (out_words + kGuardWords) * 4));
  CHECK_CUDA(cudaMemset(out, 0x5A, (out_words + kGuardWords) * 4));
  if (c.with_values) {
    CHECK_CUDA(cudaMalloc(&values, out_words * bytes + kGuardWords * 4));
    CHECK_CUDA(cudaMemset(values, 0x5A, out_words * bytes + kGuardWords * 4));
  }

  TopkProblem problem;
  problem.scores = scores_allocation + offset;
  problem.score_type = c.type;
  problem.rows = p.rows;
  problem.width = c.width;
  problem.lengths = lengths;
  problem.k = c.k;
  problem.sorted = c.sorted;
  problem.page_table = page_table;
  problem.table_count = p.table_count;
  problem.pages = p.pages;
  problem.log2_page_size = p.log2_page_size;
  problem.table_rows = table_rows;
  problem.num_valid_rows = num_valid_rows;
  problem.rows_per_group = p.rows_per_group;
  problem.out = out;
  problem.values = values;
  CHECK_CUDA(LaunchTopkSmallRows(problem, nullptr));
  CHECK_CUDA(cudaDeviceSynchronize());

  std::vector<int32_t> got_out(out_words + kGuardWords);
  std::vector<uint8_t> got_values(c.with_values ? out_words * bytes + kGuardWords * 4 : 0);
  CHECK_CUDA(cudaMemcpy(got_out.data(), out, got_out.size() * 4, cudaMemcpyDeviceToHost));
  if (c.with_values) {
    CHECK_CUDA(cudaMemcpy(got_values.data(), values, got_values.size(), cudaMemcpyDeviceToHost));
  }
  std::vector<int32_t> want_out;
  std::vector<uint32_t> want_values;
  ReferenceOutputs(p, &want_out, &want_values);

  int64_t bad_rows = 0;
  for (int64_t r = 0; r < p.rows; ++r) {
    bool same = true;
    for (int slot = 0; slot < c.k; ++slot) {
      const int64_t i = r * c.k + slot;
      same = same && got_out[i] == want_out[i];
      if (c.with_values) {
        uint32_t got = 0;
        memcpy(&got, got_values.data() + i * bytes, bytes);
        same = same && got == want_values[i];
      }
    }
    if (!same && ++bad_rows <= 3) {
      const int64_t length = c.with_lengths ? ClampLength(p.lengths[r], c.width) : c.width;
      printf("  FAIL %s row %lld (%s, length %lld): slot: got (index, value) / want\n",
             Describe(c).c_str(), static_cast<long long>(r), kFamilyNames[r % kFamilies],
             static_cast<long long>(length));
      for (int slot = 0; slot < c.k; ++slot) {
        const int64_t i = r * c.k + slot;
        uint32_t got = 0;
        if (c.with_values) memcpy(&got, got_values.data() + i * bytes, bytes);
        printf("    %2d: (%d, %08x) / (%d, %08x)\n", slot, got_out[i], got, want_out[i],
               want_values[i]);
      }
    }
  }
  bool guards_intact = true;
  for (int g = 0; g < kGuardWords; ++g) {
    guards_intact = guards_intact && static_cast<uint32_t>(got_out[out_words + g]) == kGuardBits;
  }
  for (size_t b = out_words * bytes; b < got_values.size(); ++b) {
    guards_intact = guards_intact && got_values[b] == 0x5A;
  }
  if (!guards_intact) {
    printf("  FAIL %s: a store past the outputs\n", Describe(c).c_str());
    bad_rows += 1;
  }
  CHECK_CUDA(cudaFree(scores_allocation));
  for (void* buffer : {static_cast<void*>(lengths), static_cast<void*>(num_valid_rows),
                       static_cast<void*>(page_table), static_cast<void*>(table_rows),
                       static_cast<void*>(out), static_cast<void*>(values)}) {
    if (buffer != nullptr) CHECK_CUDA(cudaFree(buffer));
  }
  return bad_rows;
}

int CheckKernel() {
  long long passed = 0, failed = 0;
  uint32_t seed = 1000;
  auto run = [&](const Case& c) {
    const int64_t bad_rows = CheckCase(c, seed++);
    if (bad_rows == 0) {
      ++passed;
    } else {
      ++failed;
      printf("FAIL %s: %lld rows differ\n", Describe(c).c_str(), static_cast<long long>(bad_rows));
    }
  };
  ForEachShape({1, 7, 33, 100, 255, 256, 257, 300, 512, 513, 777, 1000, 1024}, [&](Case c) {
    for (int variant = 0; variant < 4; ++variant) {
      c.sorted = variant % 2 == 0;
      c.with_values = variant != 3;
      c.with_lengths = variant != 2;
      run(c);
    }
    // Everything at once, on an unaligned base.
    c.sorted = c.k % 2 == 0;
    c.with_values = true;
    c.with_lengths = true;
    c.unaligned_base = true;
    c.valid_row_groups = true;
    c.page_table = true;
    run(c);
  });
  // Limits: what the launcher must refuse.
  TopkProblem refused;
  refused.rows = 1;
  refused.width = kSmallRowsMaxWidth + 1;
  const bool wide_refused = LaunchTopkSmallRows(refused, nullptr) == cudaErrorInvalidValue;
  refused.width = 1;
  refused.k = kSmallRowsMaxK + 1;
  const bool large_k_refused = LaunchTopkSmallRows(refused, nullptr) == cudaErrorInvalidValue;
  (void)cudaGetLastError();
  printf("kernel vs reference: %lld cases PASS, %lld FAIL; width > %d refused: %s, k > %d refused: %s\n",
         passed, failed, kSmallRowsMaxWidth, wide_refused ? "yes" : "NO", kSmallRowsMaxK,
         large_k_refused ? "yes" : "NO");
  return failed == 0 && wide_refused && large_k_refused ? 0 : 1;
}

// ---- Timings. ----

void TimeShape(ScoreType type, int64_t rows, int64_t width, int k, bool sorted, bool with_values,
               double copy_bytes_per_us) {
  constexpr size_t kRotationBytes = size_t{256} << 20;  // > 3x the H200's 60 MB L2
  const int bytes = ElementBytes(type);
  const size_t input_bytes = rows * width * bytes;
  const int inputs = static_cast<int>(std::max<size_t>(2, kRotationBytes / input_bytes));
  std::vector<uint8_t> host(input_bytes);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < input_bytes / bytes; ++i) {
    const uint32_t bits = FromFloat(type, normal(rng));
    memcpy(host.data() + i * bytes, &bits, bytes);
  }
  uint8_t* scores = nullptr;
  CHECK_CUDA(cudaMalloc(&scores, input_bytes * inputs));
  for (int i = 0; i < inputs; ++i) {
    CHECK_CUDA(cudaMemcpy(scores + i * input_bytes, host.data(), input_bytes, cudaMemcpyHostToDevice));
  }
  int32_t* out = nullptr;
  void* values = nullptr;
  CHECK_CUDA(cudaMalloc(&out, rows * k * 4));
  CHECK_CUDA(cudaMalloc(&values, rows * k * bytes));
  TopkProblem problem;
  problem.score_type = type;
  problem.rows = rows;
  problem.width = width;
  problem.k = k;
  problem.sorted = sorted;
  problem.out = out;
  problem.values = with_values ? values : nullptr;
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  constexpr int kWarmup = 20;
  constexpr int kCalls = 200;
  for (int call = 0; call < kWarmup + kCalls; ++call) {
    if (call == kWarmup) CHECK_CUDA(cudaEventRecord(start));
    problem.scores = scores + (call % inputs) * input_bytes;
    CHECK_CUDA(LaunchTopkSmallRows(problem, nullptr));
  }
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  const double us = 1000.0 * ms / kCalls;
  const double floor_us = input_bytes / copy_bytes_per_us;
  printf("time %-8s [%6lld, %4lld] k=%2d sorted=%d values=%d: %7.2f us a call (floor %6.2f us, "
         "%.2fx; %d inputs rotated)\n",
         TypeName(type), static_cast<long long>(rows), static_cast<long long>(width), k, sorted,
         with_values, us, floor_us, us / floor_us, inputs);
  CHECK_CUDA(cudaFree(scores));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(values));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
}

// Bytes read plus written per microsecond by a large device-to-device copy (BENCH.md's floor).
double CopyBytesPerUs() {
  constexpr size_t kBytes = size_t{512} << 20;
  void* a = nullptr;
  void* b = nullptr;
  CHECK_CUDA(cudaMalloc(&a, kBytes));
  CHECK_CUDA(cudaMalloc(&b, kBytes));
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  CHECK_CUDA(cudaMemcpy(b, a, kBytes, cudaMemcpyDeviceToDevice));
  CHECK_CUDA(cudaEventRecord(start));
  constexpr int kCopies = 10;
  for (int i = 0; i < kCopies; ++i) CHECK_CUDA(cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice));
  CHECK_CUDA(cudaEventRecord(stop));
  CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  const double bytes_per_us = 2.0 * kBytes * kCopies / (1000.0 * ms);
  printf("copy bandwidth: %.2f TB/s (read + write)\n", bytes_per_us / 1e6);
  return bytes_per_us;
}

}  // namespace
}  // namespace jax_topk

int main(int argc, char** argv) {
  using namespace jax_topk;
  if (argc > 1 && std::string(argv[1]) == "--reference-only") return CheckReference();
  const int reference_status = CheckReference();
  const int kernel_status = CheckKernel();
  const double copy_bytes_per_us = CopyBytesPerUs();
  for (ScoreType type : {ScoreType::kFloat32, ScoreType::kBfloat16}) {
    for (int64_t rows : {int64_t{4096}, int64_t{65536}}) {
      TimeShape(type, rows, 256, 8, /*sorted=*/true, /*with_values=*/true, copy_bytes_per_us);
    }
  }
  TimeShape(ScoreType::kFloat32, 65536, 256, 8, /*sorted=*/false, /*with_values=*/false,
            copy_bytes_per_us);
  TimeShape(ScoreType::kFloat32, 65536, 1024, 32, /*sorted=*/true, /*with_values=*/true,
            copy_bytes_per_us);
  return reference_status | kernel_status;
}
