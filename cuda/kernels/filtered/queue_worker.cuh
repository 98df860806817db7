// Queue mode: a persistent pool of blocks (workers), each taking whole rows from a queue in the
// workspace in completion order, one row ahead of its start.
//
// Contract: RunQueueWorker is called by every thread of every block of a queue launch; thread 0
// alone touches the queue (launch.queue_next, zero before the launch: see LaunchTopkFiltered)
// and s.queue. A barrier opens each row; the worker leaves when the queue is past the last row.
#pragma once

#include "kernels/filtered/row_runner.cuh"

namespace jax_topk {
namespace {

// One worker. Thread 0 claims each row one row ahead of its start (index and length in
// registers), so that starting a row costs no round trip to the queue and the lengths.
template <class Elements>
__device__ __forceinline__ void RunQueueWorker(SharedStorage& s, const FilteredLaunch& launch) {
  const unsigned long long rows = static_cast<unsigned long long>(launch.problem.rows);
  unsigned long long claimed = 0;
  int claimed_length = -1;
  if (threadIdx.x == 0) {
    claimed = atomicAdd(launch.queue_next, 1ull);
    if (claimed < rows) claimed_length = RowLength(launch.problem, static_cast<int64_t>(claimed));
  }
  for (;;) {
    if (threadIdx.x == 0) {
      s.queue.next_row = claimed;
      if (claimed < rows) PublishJob(s, static_cast<int64_t>(claimed), claimed_length);
    }
    __syncthreads();
    if (s.queue.next_row >= rows) break;  // rewritten only after the row's barriers
    if (threadIdx.x == 0) claimed = atomicAdd(launch.queue_next, 1ull);
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
