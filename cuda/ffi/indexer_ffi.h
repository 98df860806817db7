// The lightning indexer's two custom calls, shared by both backends' bindings: their
// attributes, operands (as jax_topk/_indexer_lowering.py emits them) and the one decoding of
// a call into an IndexerCall. A backend writes only what runs on the call (IndexerHandler).
//
// Operands: q [B, M, H, D] and keys [B, N, D] (BF16 or F8E4M3FN, one type), weights f32
// [B, M, H], key_scales f32 [B, N], lengths s32 [B, M], page_table s32 [rows, pages],
// table_rows s32 [B * M] (rows of that flat table), num_valid_rows s32 [B]; an absent optional
// operand is a placeholder its has_* attribute marks (lengths may be absent for
// jax_topk_indexer_logits only: every row whole). Result: jax_topk_indexer_logits writes
// f32 logits [B, M, N]; jax_topk_indexer_topk writes s32 indices [B, M, k] (a backend may bind
// workspaces after it).
#pragma once

#include <cstdint>
#include <type_traits>

#include "common/indexer_problem.h"
#include "common/topk_problem.h"
#include "ffi/topk_ffi.h"

namespace jax_topk {

using Float32Buffer = ffi::Buffer<ffi::F32>;

// Both targets take every attribute (XLA checks the count); indexer_logits reads only
// has_key_scales and has_lengths.
struct IndexerAttrs {
  int32_t k;
  int32_t log2_page_size;
  bool sorted;
  bool has_key_scales;
  bool has_lengths;
  bool has_page_table;
  bool has_table_rows;
  bool has_num_valid_rows;
};

}  // namespace jax_topk

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(
    jax_topk::IndexerAttrs, StructMember<int32_t>("k"), StructMember<int32_t>("log2_page_size"),
    StructMember<bool>("sorted"), StructMember<bool>("has_key_scales"),
    StructMember<bool>("has_lengths"), StructMember<bool>("has_page_table"),
    StructMember<bool>("has_table_rows"), StructMember<bool>("has_num_valid_rows"));

namespace jax_topk {

inline constexpr TopkTarget kIndexerLogitsTarget = {"jax_topk_indexer_logits", 0, kMaxWidth, kMaxK};
inline constexpr TopkTarget kIndexerTopkTarget = {"jax_topk_indexer_topk", 0, kMaxWidth, kMaxK};

// One decoded call: the logits problem (its logits pointer the result for indexer_logits, to
// be set by the backend for indexer_topk) and, for indexer_topk, the float32 selection over
// the [B * M, N] logits (its scores pointer to be set where the backend puts them).
struct IndexerCall {
  IndexerProblem logits;
  TopkProblem selection;
};

template <typename Result, typename Binding>
auto BindIndexerOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()  // q
      .template Arg<ffi::AnyBuffer>()  // keys
      .template Arg<Float32Buffer>()   // weights
      .template Arg<Float32Buffer>()   // key_scales
      .template Arg<Int32Buffer>()     // lengths
      .template Arg<Int32Buffer>()     // page_table
      .template Arg<Int32Buffer>()     // table_rows
      .template Arg<Int32Buffer>()     // num_valid_rows
      .template Ret<Result>()
      .template Attrs<IndexerAttrs>();
}

struct IndexerOperands {
  ffi::AnyBuffer q;
  ffi::AnyBuffer keys;
  Float32Buffer weights;
  Float32Buffer key_scales;
  Int32Buffer lengths;
  Int32Buffer page_table;
  Int32Buffer table_rows;
  Int32Buffer num_valid_rows;
};

// Fills `call` from XLA's buffers and re-checks what the trace-time checks guarantee, so that
// a caller bypassing them cannot make a handler read or write out of bounds. `result` is the
// logits (selects = false) or the indices (selects = true).
inline ffi::Error DecodeIndexerCall(const TopkTarget& target, const IndexerOperands& operands,
                                    void* result, size_t result_count, const IndexerAttrs& attrs,
                                    bool selects, IndexerCall* call) {
  const ffi::DataType type = operands.q.element_type();
  if (operands.keys.element_type() != type || (type != ffi::BF16 && type != ffi::F8E4M3FN))
    return InvalidTopkCall(target, "q and keys have element types ", type, " and ",
                           operands.keys.element_type(), "; both must be BF16 or F8E4M3FN");
  const auto q_dims = operands.q.dimensions();
  const auto keys_dims = operands.keys.dimensions();
  if (q_dims.size() != 4 || keys_dims.size() != 3 || keys_dims[0] != q_dims[0] ||
      keys_dims[2] != q_dims[3])
    return InvalidTopkCall(target, "q must be [B, M, H, D] and keys [B, N, D]");
  IndexerProblem& p = call->logits;
  p.input = type == ffi::BF16 ? IndexerInput::kBfloat16 : IndexerInput::kFloat8E4M3;
  p.batch = q_dims[0];
  p.queries = q_dims[1];
  p.heads = q_dims[2];
  p.head_dim = q_dims[3];
  p.keys_count = keys_dims[1];
  const size_t rows = static_cast<size_t>(p.batch * p.queries);
  if (selects && !attrs.has_lengths) return InvalidTopkCall(target, "indexer_topk needs lengths");
  if (operands.weights.element_count() != rows * p.heads ||
      (attrs.has_lengths && operands.lengths.element_count() != rows) ||
      (attrs.has_key_scales &&
       operands.key_scales.element_count() != static_cast<size_t>(p.batch * p.keys_count)))
    return InvalidTopkCall(target, "weights, lengths or key_scales do not match q and keys");
  if (p.keys_count > target.max_width)
    return InvalidTopkCall(target, "N = ", p.keys_count, " exceeds its limit of ",
                           target.max_width);
  p.q = operands.q.untyped_data();
  p.keys = operands.keys.untyped_data();
  p.weights = operands.weights.typed_data();
  p.key_scales = attrs.has_key_scales ? operands.key_scales.typed_data() : nullptr;
  p.lengths = attrs.has_lengths ? operands.lengths.typed_data() : nullptr;  // null: rows whole
  if (!selects) {
    if (result_count != rows * p.keys_count)
      return InvalidTopkCall(target, "the logits must be [B, M, N]");
    p.logits = static_cast<float*>(result);
    return ffi::Error::Success();
  }
  TopkProblem& s = call->selection;
  s.score_type = ScoreType::kFloat32;
  s.rows = static_cast<int64_t>(rows);
  s.width = p.keys_count;
  s.lengths = p.lengths;
  s.k = attrs.k;
  s.sorted = attrs.sorted;
  if (attrs.has_page_table && operands.page_table.dimensions().size() != 2)
    return InvalidTopkCall(target, "page_table must be 2-D");
  DecodeRowOptions(operands.page_table, operands.table_rows, operands.num_valid_rows,
                   attrs.has_page_table, attrs.has_table_rows, attrs.has_num_valid_rows,
                   attrs.log2_page_size, &s);
  s.out = static_cast<int32_t*>(result);
  if (result_count != rows * static_cast<size_t>(s.k))
    return InvalidTopkCall(target, "the indices must be [B, M, k]");
  return CheckTopkSizes(target, s, operands.lengths.element_count(),
                        operands.table_rows.element_count(),
                        operands.num_valid_rows.element_count());
}

// The handler of one indexer target on one backend: decodes the call and hands it to
// Run(context, call, extra_results...). Result is Float32Buffer (indexer_logits) or
// Int32Buffer (indexer_topk). Bind with BindIndexerOperands<Result>.
template <const TopkTarget& Target, typename Result, auto Run>
struct IndexerHandler;

template <const TopkTarget& Target, typename Result, typename Context, typename... ExtraResults,
          ffi::Error (*Run)(Context, const IndexerCall&, ExtraResults...)>
struct IndexerHandler<Target, Result, Run> {
  static ffi::Error Call(Context context, ffi::AnyBuffer q, ffi::AnyBuffer keys,
                         Float32Buffer weights, Float32Buffer key_scales, Int32Buffer lengths,
                         Int32Buffer page_table, Int32Buffer table_rows, Int32Buffer num_valid_rows,
                         ffi::Result<Result> result, IndexerAttrs attrs,
                         ExtraResults... extra_results) {
    IndexerCall call;
    ffi::Error error = DecodeIndexerCall(
        Target, {q, keys, weights, key_scales, lengths, page_table, table_rows, num_valid_rows},
        result->untyped_data(), result->element_count(), attrs, std::is_same_v<Result, Int32Buffer>,
        &call);
    if (error.failure()) return error;
    return Run(context, call, extra_results...);
  }
};

}  // namespace jax_topk
