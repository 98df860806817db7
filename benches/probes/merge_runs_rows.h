// The host side of the sorted-runs probe (benches/probes/merge_runs.cu): its reference and
// its rows, shared with the host run of the kernel (benches/probes/merge_runs_on_host.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/topk_common.h"
#include "common/value_traits.h"

namespace merge_runs {

constexpr int kRowKinds = 7;
inline const char* const kRowKindNames[kRowKinds] = {
    "normal", "few values", "constant", "part-filled", "NaN at ends", "repeated lists", "unsorted"};

// The host reference: candidates (column >= 0, not NaN) by key descending, column ascending.
template <typename Values>
void Reference(const std::vector<typename Values::Bits>& values,
               const std::vector<int32_t>& indices, int64_t rows, int width, int k,
               std::vector<typename Values::Bits>* want_values, std::vector<int32_t>* want_indices,
               std::vector<bool>* not_runs, int max_runs) {
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
    (*not_runs)[r] = runs > max_runs;
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

inline uint32_t FloatBits(float x) {
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

// The checks' shapes: lists x per_list candidates a row, k.
struct Shape {
  int lists, per_list, k;
};
inline constexpr Shape kCheckShapes[] = {{8, 2048, 2048}, {8, 2048, 333},   {3, 1999, 1500},
                                         {2, 5, 3},       {16, 1024, 2048}, {1, 2048, 7}};

// One check's rows and what the kernel must write for them.
template <typename Values>
struct Case {
  using Bits = typename Values::Bits;
  int64_t rows;
  int width, k;
  std::vector<Bits> values, want_values;
  std::vector<int32_t> indices, want_indices;
  std::vector<bool> not_runs;  // rows of more than max_runs runs: flagged, not written

  Case(std::mt19937& rng, int64_t rows_, Shape shape, int kind, int max_runs)
      : rows(rows_), width(shape.lists * shape.per_list), k(shape.k) {
    MakeRows<Values>(rng, rows, shape.lists, shape.per_list, kind, &values, &indices);
    want_values.resize(rows * k);
    want_indices.resize(rows * k);
    not_runs.resize(rows);
    Reference<Values>(values, indices, rows, width, k, &want_values, &want_indices, &not_runs,
                      max_runs);
  }

  // The rows whose output differs (the first printed); a flagged row must be a not-runs one.
  int64_t Mismatches(const char* name, const std::vector<Bits>& got_values,
                     const std::vector<int32_t>& got_indices, int32_t not_runs_mark,
                     const char* status) const {
    int64_t bad = 0, flagged = 0;
    for (int64_t r = 0; r < rows; ++r) {
      const bool marked = got_indices[r * k] == not_runs_mark;
      flagged += marked;
      bool ok = marked == not_runs[r];
      if (ok && !marked) {
        ok = std::equal(&got_values[r * k], &got_values[(r + 1) * k], &want_values[r * k]) &&
             std::equal(&got_indices[r * k], &got_indices[(r + 1) * k], &want_indices[r * k]);
      }
      if (!ok && bad++ == 0) {
        int slot = 0;
        while (slot < k - 1 && got_indices[r * k + slot] == want_indices[r * k + slot]) ++slot;
        std::printf("MISMATCH %s row %lld slot %d: got column %d, want %d (not runs %d)\n", name,
                    static_cast<long long>(r), slot, got_indices[r * k + slot],
                    want_indices[r * k + slot], static_cast<int>(not_runs[r]));
      }
    }
    std::printf("check %-34s rows %5lld width %5d k %4d: %s, %lld rows not runs (%s)\n", name,
                static_cast<long long>(rows), width, k, bad == 0 ? "exact" : "WRONG",
                static_cast<long long>(flagged), status);
    return bad;
  }
};

// Calls check(Values{}, name, shape, kind) for every row kind, shape and value type (float32,
// bfloat16); returns the sum of what the calls return (their mismatching rows).
template <typename CheckOne>
int64_t ForEveryCheck(CheckOne check) {
  int64_t bad = 0;
  for (int kind = 0; kind < kRowKinds; ++kind) {
    for (const Shape shape : kCheckShapes) {
      char name[64];
      const char* kind_name = kRowKindNames[kind];
      std::snprintf(name, sizeof(name), "f32 %s %dx%d", kind_name, shape.lists, shape.per_list);
      bad += check(jax_topk::F32Values{}, name, shape, kind);
      std::snprintf(name, sizeof(name), "bf16 %s %dx%d", kind_name, shape.lists, shape.per_list);
      bad += check(jax_topk::Bf16Values{}, name, shape, kind);
    }
  }
  return bad;
}

}  // namespace merge_runs
