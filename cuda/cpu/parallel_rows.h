// Rows of a CPU handler spread over the host's cores: the calling thread and up to
// `pool_threads` helper tasks on XLA's thread pool pull chunks of rows from an atomic
// counter (uneven rows balance), each thread with its own scratch state. The calling thread
// always works too and waits only for rows other threads have started, never for a task the
// pool has not run: no deadlock when the pool is busy.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace jax_topk {

// Runs a task on one of the host's worker threads (XLA's pool) or, failing that, inline.
using ScheduleTask = std::function<void(std::function<void()>)>;

// Calls run(state, first_row, end_row) over [0, rows) in chunks, `state` a State of the
// calling thread's own (default-constructed once per thread). `work_per_row` (elements
// touched) decides how many helpers are worth starting.
template <typename State, typename Run>
void ParallelRows(int64_t rows, int64_t work_per_row, const ScheduleTask& schedule,
                  int64_t pool_threads, const Run& run) {
  constexpr int64_t kRowsPerChunk = 4;
  constexpr int64_t kMinElementsPerThread = 1 << 16;
  // Shared with the helper tasks through a shared_ptr: a task that starts after the call
  // returned finds no rows left and touches nothing else (`run` is never called again).
  struct Queue {
    std::function<void(State&, int64_t, int64_t)> run;
    int64_t rows;
    std::atomic<int64_t> next_row{0};
    std::atomic<int64_t> rows_done{0};
    std::mutex mutex;
    std::condition_variable all_done;
  };
  auto queue = std::make_shared<Queue>();
  queue->run = run;
  queue->rows = rows;
  const auto drain = [](Queue& q) {
    State state;
    for (;;) {
      const int64_t first = q.next_row.fetch_add(kRowsPerChunk);
      if (first >= q.rows) return;
      const int64_t end = std::min(first + kRowsPerChunk, q.rows);
      q.run(state, first, end);
      if (q.rows_done.fetch_add(end - first) + (end - first) == q.rows) {
        std::lock_guard<std::mutex> lock(q.mutex);
        q.all_done.notify_all();
      }
    }
  };
  const int64_t work = rows * std::max<int64_t>(work_per_row, 1);
  const int64_t helpers = std::clamp<int64_t>(work / kMinElementsPerThread - 1, 0, pool_threads);
  for (int64_t t = 0; t < helpers; ++t) schedule([queue, drain]() { drain(*queue); });
  drain(*queue);
  std::unique_lock<std::mutex> lock(queue->mutex);
  queue->all_done.wait(lock, [&]() { return queue->rows_done.load() == rows; });
}

}  // namespace jax_topk
