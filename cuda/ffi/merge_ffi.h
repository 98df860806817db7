// merge_topk's custom call, shared by both backends' bindings: its attributes, operands
// (values [rows, m] and int32 indices [rows, m] in; values [rows, k] and indices [rows, k]
// out, as jax_topk/_merge.py lowers it) and their one decoding into a MergeProblem. A
// backend writes only what runs on the problem (MergeHandler below).
#pragma once

#include <cstdint>

#include "common/merge_problem.h"
#include "ffi/topk_ffi.h"

namespace jax_topk {

struct MergeAttrs {
  int32_t k;
  bool sorted;
};

}  // namespace jax_topk

XLA_FFI_REGISTER_STRUCT_ATTR_DECODING(jax_topk::MergeAttrs, StructMember<int32_t>("k"),
                                      StructMember<bool>("sorted"));

namespace jax_topk {

// Its name and limits, for the registrations and the error messages.
inline constexpr TopkTarget kMergeTopkTarget = {"jax_topk_merge", kFastScoreTypes, kMaxMergeWidth,
                                                kMaxK};

template <typename Binding>
auto BindMergeOperands(Binding binding) {
  return std::move(binding)
      .template Arg<ffi::AnyBuffer>()
      .template Arg<Int32Buffer>()
      .template Ret<ffi::AnyBuffer>()
      .template Ret<Int32Buffer>()
      .template Attrs<MergeAttrs>();
}

// Fills `problem` from XLA's buffers and re-checks what the trace-time checks guarantee,
// so that a caller bypassing them cannot make a handler read or write out of bounds.
inline ffi::Error DecodeMergeProblem(ffi::AnyBuffer values, Int32Buffer indices,
                                     ffi::AnyBuffer out_values, Int32Buffer out_indices,
                                     const MergeAttrs& attrs, MergeProblem* problem) {
  const TopkTarget& target = kMergeTopkTarget;
  const std::optional<ScoreType> score_type = ScoreTypeOf(values.element_type());
  if (!score_type)
    return InvalidTopkCall(target, "values have element type ", values.element_type(),
                           "; this target takes ", ScoreTypeNames(target));
  const auto dims = values.dimensions();
  if (dims.size() != 2 || indices.dimensions().size() != 2 || indices.dimensions()[0] != dims[0] ||
      indices.dimensions()[1] != dims[1])
    return InvalidTopkCall(target, "values and indices must be 2-D of one shape");
  MergeProblem& p = *problem;
  p.values = values.untyped_data();
  p.indices = indices.typed_data();
  p.score_type = *score_type;
  p.rows = dims[0];
  p.width = dims[1];
  p.k = attrs.k;
  p.sorted = attrs.sorted;
  p.out_values = out_values.untyped_data();
  p.out_indices = out_indices.typed_data();
  if (p.k < 1 || p.k > target.max_k || p.k > p.width)
    return InvalidTopkCall(target, "k = ", p.k, " is outside [1, min(", p.width, ", ", target.max_k,
                           ")]");
  if (p.width > target.max_width)
    return InvalidTopkCall(target, "rows of ", p.width, " candidates exceed its limit of ",
                           target.max_width);
  const size_t out_count = static_cast<size_t>(p.rows) * p.k;
  if (out_values.element_type() != values.element_type() ||
      out_values.element_count() != out_count || out_indices.element_count() != out_count)
    return InvalidTopkCall(target, "the results must be [", p.rows, ", ", p.k, "]");
  return ffi::Error::Success();
}

// The handler on one backend: decodes the call and hands the problem to Run(context,
// problem). Bind with BindMergeOperands.
template <auto Run>
struct MergeHandler;

template <typename Context, ffi::Error (*Run)(Context, const MergeProblem&)>
struct MergeHandler<Run> {
  static ffi::Error Call(Context context, ffi::AnyBuffer values, Int32Buffer indices,
                         ffi::Result<ffi::AnyBuffer> out_values,
                         ffi::Result<Int32Buffer> out_indices, MergeAttrs attrs) {
    MergeProblem problem;
    ffi::Error error =
        DecodeMergeProblem(values, indices, *out_values, *out_indices, attrs, &problem);
    if (error.failure()) return error;
    return Run(context, problem);
  }
};

}  // namespace jax_topk
