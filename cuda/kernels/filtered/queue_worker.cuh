// Queue mode: a persistent pool of blocks (workers), each taking whole rows from a queue in the
// workspace in completion order, one row ahead of its start.
//
// Contract: RunQueueWorker is called by every thread of every block of a queue launch; thread 0
// alone touches the queue (launch.queue_next, zero before a launch of fewer blocks than rows)
// and s.queue. A barrier opens each row; the worker leaves when the queue is past the last row.
#pragma once

#include "kernels/filtered/row_runner.cuh"

namespace jax_topk {
namespace {

// One worker. Thread 0 claims each row one row ahead of its start (index and length in
// registers), so that starting a row costs no round trip to the queue and the lengths. A launch
// with a block for every row (rows <= the grid) needs no queue: block b takes row b alone, and
// the host sets no counter before it (one graph node fewer: benches/NOTES.md "queue lead").
template <class Elements>
__device__ __forceinline__ void RunQueueWorker(SharedStorage& s, const FilteredLaunch& launch) {
  const unsigned long long rows = static_cast<unsigned long long>(launch.problem.rows);
  const auto claim = [&](bool first) {  // thread 0: the next row (>= rows: none)
    if (rows <= gridDim.x) return first ? static_cast<unsigned long long>(blockIdx.x) : rows;
    return atomicAdd(launch.queue_next, 1ull);
  };
  unsigned long long claimed = 0;
  int claimed_length = -1;
  if (threadIdx.x == 0) {
    claimed = claim(true);
    if (claimed < rows) claimed_length = RowLength(launch.problem, static_cast<int64_t>(claimed));
  }
  for (;;) {
    if (threadIdx.x == 0) {
      s.queue.next_row = claimed;
      if (claimed < rows)
        PublishJob(s, static_cast<int64_t>(claimed), claimed_length, launch.queue_reads);
    }
    __syncthreads();
    if (s.queue.next_row >= rows) break;  // rewritten only after the row's barriers
    if (threadIdx.x == 0) claimed = claim(false);
    // The claim's latency hides behind the row's pass; its length is read once it has returned.
    RunRow<Elements>(s, launch, kWholeRowRankSlack, [&] {
      if (threadIdx.x != 0) return;
      const bool real = claimed < static_cast<unsigned long long>(launch.problem.rows);
      claimed_length = real ? RowLength(launch.problem, static_cast<int64_t>(claimed)) : -1;
    });
  }
}

}  // namespace
}  // namespace jax_topk
