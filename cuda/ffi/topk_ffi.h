// What both backends' FFI bindings share: the custom call's signature (operands and
// attributes, as jax_topk/_lowering.py emits them), what each target accepts, and the one
// decoding of a call into a TopkProblem. A backend writes only what runs on the problem
// (TopkHandler below). No algorithm lives here.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "common/topk_common.h"
#include "common/topk_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jax_topk {

namespace ffi = xla::ffi;
using Int32Buffer = ffi::Buffer<ffi::S32>;

// The custom call's attributes, decoded by name into one struct (the registration below).
// Each has_* says whether the optional operand of that name is real or a placeholder.
struct TopkAttrs {
  int32_t k;
  int32_t log2_page_size;
  bool sorted;
  bool has_page_table;
  bool has_table_rows;
  bool has_num_valid_rows;
  bool with_values;  // the values result is [rows, k] in the scores' type, else a placeholder
  bool has_lengths;  // else every row is whole (top_k without lengths) and lengths is empty
};

}  // namespace jax_topk

// The members follow TopkAttrs' declaration order (the decoder builds it by aggregate
// initialisation) and name every attribute the lowering emits (XLA rejects a call whose
// attribute count differs). The macro opens namespace xla::ffi itself: it stays at file scope.
XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    jax_topk::TopkAttrs, StructMember<int32_t>("k"), StructMember<int32_t>("log2_page_size"),
    StructMember<bool>("sorted"), StructMember<bool>("has_page_table"),
    StructMember<bool>("has_table_rows"), StructMember<bool>("has_num_valid_rows"),
    StructMember<bool>("with_values"), StructMember<bool>("has_lengths"));

namespace jax_topk {

// Each ScoreType's XLA element type, indexed by ScoreType.
constexpr ffi::DataType kScoreElementTypes[] = {ffi::F32, ffi::BF16, ffi::F16};

constexpr uint32_t ScoreTypeBit(ScoreType type) {
  return 1u << static_cast<int32_t>(type);
}

// What a custom-call target accepts on every backend: its name (the one
// jax_topk/_lowering.py lowers to) and its score types, one ScoreTypeBit each.
struct TopkTarget {
  const char* name;
  uint32_t score_types;
  int64_t max_width;  // the longest row its kernel takes
  int32_t max_k;
};
constexpr uint32_t kSixteenBitTypes =
    ScoreTypeBit(ScoreType::kBfloat16) | ScoreTypeBit(ScoreType::kFloat16);
constexpr uint32_t kFastScoreTypes = ScoreTypeBit(ScoreType::kFloat32) | kSixteenBitTypes;
// The register kernel: a block a row, 16-bit rows in registers.
inline constexpr TopkTarget kTopkBf16Target = {"jax_topk_bf16", kSixteenBitTypes, kMaxBf16Width,
                                               kMaxK};
// The sampled filtering kernel: rows of any length.
inline constexpr TopkTarget kTopkFilteredTarget = {"jax_topk_filtered", kFastScoreTypes, kMaxWidth,
                                                   kMaxK};
// The small-row kernel: a warp a row (top_k's MoE-routing shapes).
inline constexpr TopkTarget kTopkSmallRowsTarget = {"jax_topk_small_rows", kFastScoreTypes,
                                                    kSmallRowsMaxWidth, kSmallRowsMaxK};

// Operands: scores [rows, width], lengths [rows] (optional), page_table [table_count, pages],
// table_rows [rows], num_valid_rows [groups]; results: out [rows, k] and values ([rows, k]
// in the scores' type when with_values, else an unread placeholder). An absent optional
// operand arrives as a placeholder (its has_* attribute is false) and is never read.
// num_valid_rows holds one limit per equal group of consecutive rows (one group unless
// vmapped or sharded), so the group size is rows / its length. A backend binds its
// context first and may bind further results after.
struct TopkOperands {
  ffi::AnyBuffer scores;
  Int32Buffer lengths;
  Int32Buffer page_table;
  Int32Buffer table_rows;
  Int32Buffer num_valid_rows;
  Int32Buffer out;        // the indices
  ffi::AnyBuffer values;  // the selected values, or a placeholder
};

template <typename Binding>
auto BindTopkOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<Int32Buffer>()
      .template Arg<Int32Buffer>()
      .template Arg<Int32Buffer>()
      .template Arg<Int32Buffer>()
      .template Ret<Int32Buffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Attrs<TopkAttrs>();
}

// An InvalidArgument naming the target, its message the parts streamed in order.
template <typename... Parts>
ffi::Error InvalidTopkCall(const TopkTarget& target, const Parts&... parts) {
  std::ostringstream message;
  message << target.name << ": ";
  (message << ... << parts);
  return ffi::Error::InvalidArgument(message.str());
}

// The ScoreType of an XLA element type, or nothing when it is none of them.
inline std::optional<ScoreType> ScoreTypeOf(ffi::DataType element_type) {
  for (int32_t type = 0; type < static_cast<int32_t>(std::size(kScoreElementTypes)); ++type)
    if (kScoreElementTypes[type] == element_type) return static_cast<ScoreType>(type);
  return std::nullopt;
}

// The target's score types as XLA names them, for an error message: "BF16" or "F32, F16".
inline std::string ScoreTypeNames(const TopkTarget& target) {
  std::ostringstream names;
  const char* separator = "";
  for (int32_t type = 0; type < static_cast<int32_t>(std::size(kScoreElementTypes)); ++type) {
    if (!(target.score_types & ScoreTypeBit(static_cast<ScoreType>(type)))) continue;
    names << separator << kScoreElementTypes[type];
    separator = ", ";
  }
  return names.str();
}

// The checks of a problem's sizes against its operands' (lengths, table_rows and
// num_valid_rows entries), shared with the indexer's selection (ffi/indexer_ffi.h).
// lengths_size < 0: the call has no lengths (has_lengths false).
inline ffi::Error CheckTopkSizes(const TopkTarget& target, const TopkProblem& p,
                                 int64_t lengths_size, int64_t table_rows_size, int64_t groups) {
  if (p.k < 1 || p.k > target.max_k)
    return InvalidTopkCall(target, "k = ", p.k, " is outside [1, ", target.max_k, "]");
  if (p.width > target.max_width)
    return InvalidTopkCall(target, "rows of ", p.width, " columns exceed its limit of ",
                           target.max_width);
  if (lengths_size >= 0 && p.rows > 0 && lengths_size != p.rows)
    return InvalidTopkCall(target, "lengths has ", lengths_size, " entries for ", p.rows, " rows");
  if (p.page_table != nullptr) {
    if (p.log2_page_size < 0 || p.log2_page_size > 30 ||
        p.pages < ((p.width + (int64_t{1} << p.log2_page_size) - 1) >> p.log2_page_size) ||
        (p.rows > 0 && p.table_count < 1))
      return InvalidTopkCall(target, "page_table [", p.table_count, ", ", p.pages,
                             "] with pages of 2^", p.log2_page_size, " columns cannot map ",
                             p.width, " columns");
    if (p.table_rows == nullptr && p.table_count < p.rows)
      return InvalidTopkCall(target, "page_table has ", p.table_count, " rows for ", p.rows,
                             " score rows and there is no table_rows");
    if (p.table_rows != nullptr && table_rows_size != p.rows)
      return InvalidTopkCall(target, "table_rows has ", table_rows_size, " entries for ", p.rows,
                             " rows");
  }
  if (p.num_valid_rows != nullptr && p.rows > 0 && (groups < 1 || p.rows % groups != 0))
    return InvalidTopkCall(target, "num_valid_rows has ", groups, " entries, which do not divide ",
                           p.rows, " rows");
  return ffi::Error::Success();
}

// The shape rules are enforced at trace time; this re-checks what would make a handler
// read out of bounds if a caller bypassed them.
inline ffi::Error CheckTopkProblem(const TopkTarget& target, const TopkProblem& p,
                                   const TopkOperands& operands, bool has_lengths) {
  if (operands.out.element_count() != static_cast<size_t>(p.rows) * p.k)
    return InvalidTopkCall(target, "the indices result must be [", p.rows, ", ", p.k, "]");
  if (p.values != nullptr && (operands.values.element_type() != operands.scores.element_type() ||
                              operands.values.element_count() != static_cast<size_t>(p.rows) * p.k))
    return InvalidTopkCall(target, "values must be [", p.rows, ", ", p.k,
                           "] of the scores' element type");
  const int64_t lengths_size =
      has_lengths ? static_cast<int64_t>(operands.lengths.element_count()) : -1;
  return CheckTopkSizes(target, p, lengths_size, operands.table_rows.element_count(),
                        operands.num_valid_rows.element_count());
}

// The optional per-row operands into a problem whose rows are set: the page table (2-D
// [table_count, pages]) and table_rows, and num_valid_rows' equal groups of rows.
inline void DecodeRowOptions(Int32Buffer page_table, Int32Buffer table_rows,
                             Int32Buffer num_valid_rows, bool has_page_table, bool has_table_rows,
                             bool has_num_valid_rows, int32_t log2_page_size,
                             TopkProblem* problem) {
  TopkProblem& p = *problem;
  if (has_page_table) {
    p.page_table = page_table.typed_data();
    p.table_count = page_table.dimensions()[0];
    p.pages = page_table.dimensions()[1];
    p.log2_page_size = log2_page_size;
    if (has_table_rows) p.table_rows = table_rows.typed_data();
  }
  if (has_num_valid_rows) {
    const int64_t groups = static_cast<int64_t>(num_valid_rows.element_count());
    p.num_valid_rows = num_valid_rows.typed_data();
    p.rows_per_group = groups > 0 && p.rows >= groups ? p.rows / groups : 1;
  }
}

// The one decoding of a call: fills `problem` from XLA's buffers and checks it; a failure
// is returned to XLA as is.
inline ffi::Error DecodeTopkProblem(const TopkTarget& target, const TopkOperands& operands,
                                    const TopkAttrs& attrs, TopkProblem* problem) {
  TopkProblem& p = *problem;
  const ffi::DataType element_type = operands.scores.element_type();
  const std::optional<ScoreType> score_type = ScoreTypeOf(element_type);
  if (!score_type || !(target.score_types & ScoreTypeBit(*score_type)))
    return InvalidTopkCall(target, "scores have element type ", element_type,
                           "; this target takes ", ScoreTypeNames(target));
  const auto dims = operands.scores.dimensions();
  if (dims.size() != 2 || (attrs.has_page_table && operands.page_table.dimensions().size() != 2))
    return InvalidTopkCall(target, "scores and page_table must be 2-D");
  p.scores = operands.scores.untyped_data();
  p.score_type = *score_type;
  p.rows = dims[0];
  p.width = dims[1];
  p.lengths = attrs.has_lengths ? operands.lengths.typed_data() : nullptr;  // null: rows whole
  p.k = attrs.k;
  p.sorted = attrs.sorted;
  DecodeRowOptions(operands.page_table, operands.table_rows, operands.num_valid_rows,
                   attrs.has_page_table, attrs.has_table_rows, attrs.has_num_valid_rows,
                   attrs.log2_page_size, &p);
  p.out = operands.out.typed_data();
  if (attrs.with_values) p.values = operands.values.untyped_data();
  return CheckTopkProblem(target, p, operands, attrs.has_lengths);
}

// The handler of one target on one backend: decodes the call into a TopkProblem and hands
// it to Run(context, problem, extra_results...). Context is what the backend's Ctx binding
// decodes to (XLA's CPU thread pool, the CUDA stream); extra results are those bound after
// the operands (the filtered kernel's CUDA workspace). Bind with BindTopkOperands.
template <const TopkTarget& Target, auto Run>
struct TopkHandler;

template <const TopkTarget& Target, typename Context, typename... ExtraResults,
          ffi::Error (*Run)(Context, const TopkProblem&, ExtraResults...)>
struct TopkHandler<Target, Run> {
  static ffi::Error Call(Context context, ffi::AnyBuffer scores, Int32Buffer lengths,
                         Int32Buffer page_table, Int32Buffer table_rows, Int32Buffer num_valid_rows,
                         ffi::Result<Int32Buffer> out, ffi::Result<ffi::AnyBuffer> values,
                         TopkAttrs attrs, ExtraResults... extra_results) {
    TopkProblem problem;
    ffi::Error error = DecodeTopkProblem(
        Target, {scores, lengths, page_table, table_rows, num_valid_rows, *out, *values}, attrs,
        &problem);
    if (error.failure()) return error;
    return Run(context, problem, extra_results...);
  }
};

}  // namespace jax_topk
