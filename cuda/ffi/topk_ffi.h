// What both backends' FFI bindings share: the custom call's signature (operands and
// attributes, in the order jax_topk/_lowering.py emits them) and the decoding of XLA's
// buffers into a TopkProblem. No algorithm lives here.
#pragma once

#include <cstdint>
#include <utility>

#include "common/topk_common.h"
#include "common/topk_problem.h"
#include "xla/ffi/api/ffi.h"

namespace jax_topk {

namespace ffi = xla::ffi;
using Int32Buffer = ffi::Buffer<ffi::S32>;

// Operands: scores [rows, width], lengths [rows], page_table [table_count, pages],
// table_rows [rows], num_valid_rows [groups]. An absent optional operand arrives as a
// placeholder (its has_* attribute is false) and is never read.
// Attributes: k, log2_page_size, sorted, has_page_table, has_table_rows,
// has_num_valid_rows. num_valid_rows holds one limit per equal group of consecutive rows
// (one group unless vmapped or sharded), so the group size is rows / its length.
template <ffi::DataType ScoreType, typename Binding>
auto BindTopkOperands(Binding binding) {
  return std::move(binding).template Arg<ffi::Buffer<ScoreType>>()
      .template Arg<Int32Buffer>()
      .template Arg<Int32Buffer>()
      .template Arg<Int32Buffer>()
      .template Arg<Int32Buffer>()
      .template Ret<Int32Buffer>()
      .template Attr<int32_t>("k")
      .template Attr<int32_t>("log2_page_size")
      .template Attr<bool>("sorted")
      .template Attr<bool>("has_page_table")
      .template Attr<bool>("has_table_rows")
      .template Attr<bool>("has_num_valid_rows");
}

// The shape rules are enforced at trace time; this re-checks what would make a handler
// read out of bounds if a caller bypassed them.
inline ffi::Error CheckTopkProblem(const TopkProblem& p, int64_t lengths_size,
                                   int64_t num_valid_rows_size, int64_t table_rows_size) {
  if (p.k < 1 || p.k > kMaxK) return ffi::Error::InvalidArgument("jax_topk: k out of range");
  if (p.rows > 0 && lengths_size != p.rows)
    return ffi::Error::InvalidArgument("jax_topk: lengths must have one entry per row");
  if (p.page_table != nullptr) {
    if (p.log2_page_size < 0 || p.log2_page_size > 30 ||
        (p.pages << p.log2_page_size) < p.width || (p.rows > 0 && p.table_count < 1))
      return ffi::Error::InvalidArgument("jax_topk: page table too small for the rows");
    if (p.table_rows == nullptr && p.table_count < p.rows)
      return ffi::Error::InvalidArgument("jax_topk: page table needs one row per score row");
    if (p.table_rows != nullptr && table_rows_size != p.rows)
      return ffi::Error::InvalidArgument("jax_topk: table_rows must have one entry per row");
  }
  if (p.num_valid_rows != nullptr && p.rows > 0 &&
      (num_valid_rows_size < 1 || p.rows % num_valid_rows_size != 0))
    return ffi::Error::InvalidArgument("jax_topk: num_valid_rows does not match the row groups");
  return ffi::Error::Success();
}

// Fills `problem` from XLA's buffers and checks it; a failure is returned to XLA as is.
template <ffi::DataType ScoreType>
ffi::Error DecodeTopkProblem(ffi::Buffer<ScoreType> scores, Int32Buffer lengths,
                             Int32Buffer page_table, Int32Buffer table_rows,
                             Int32Buffer num_valid_rows, ffi::Result<Int32Buffer> out, int32_t k,
                             int32_t log2_page_size, bool sorted, bool has_page_table,
                             bool has_table_rows, bool has_num_valid_rows,
                             TopkProblem* problem) {
  TopkProblem& p = *problem;
  const auto dims = scores.dimensions();
  if (dims.size() != 2 || (has_page_table && page_table.dimensions().size() != 2))
    return ffi::Error::InvalidArgument("jax_topk: scores and page_table must be 2-D");
  p.scores = scores.untyped_data();
  p.rows = dims[0];
  p.width = dims[1];
  p.lengths = lengths.typed_data();
  p.k = k;
  p.sorted = sorted;
  if (has_page_table) {
    p.page_table = page_table.typed_data();
    p.table_count = page_table.dimensions()[0];
    p.pages = page_table.dimensions()[1];
    p.log2_page_size = log2_page_size;
    if (has_table_rows) p.table_rows = table_rows.typed_data();
  }
  const int64_t groups = static_cast<int64_t>(num_valid_rows.element_count());
  if (has_num_valid_rows) {
    p.num_valid_rows = num_valid_rows.typed_data();
    p.rows_per_group = groups > 0 && p.rows >= groups ? p.rows / groups : 1;
  }
  p.out = out->typed_data();
  return CheckTopkProblem(p, lengths.element_count(), num_valid_rows.element_count(),
                          table_rows.element_count());
}

}  // namespace jax_topk
