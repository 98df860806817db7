// A peer for issue 16's latency table: CUB's top-k (CCCL 3.5 from the nvidia-cuda-cccl wheel;
// not in the CUDA 13.0 toolkit) on the same shapes as benches/bench.py, timed as the issue's
// FlashInfer figures were: the call captured once in a CUDA graph, the graph replayed, CUDA
// events around each batch of replays. cub::DeviceBatchedTopK takes rows of at most 8192 (one
// block a row; its 16384-wide tuning does not fit a block's shared memory with int32 values, a
// compile-time error), so issue 16's rows (16384 and longer) go to cub::DeviceTopK, one call a
// row, the rows spread over up to 32 parallel streams in the same graph (what a caller of CUB
// has for them); two 8192 shapes show the batched one.
//   cub_batched_topk [--json PATH]
// For each shape: float32 or bfloat16 rows of random normals (bf16 as its 16-bit pattern
// through an order-preserving key: CUB sorts unsigned keys), lengths "full" or "causal"
// (row i of M has N - (M - 1 - i) elements), k = 2048 or 512; keys and their columns out.
// CUB's batched top-k only offers unsorted, non-deterministic output today (its tie order is
// unspecified), a weaker contract than jax_topk's: the check here compares the selected key
// multiset per row with a host nth_element, not the columns.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <cub/device/device_batched_topk.cuh>
#include <cub/device/device_topk.cuh>
#include <cuda/argument>
#include <cuda/iterator>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define CHECK(call)                                                     \
  do {                                                                  \
    cudaError_t error_ = (call);                                        \
    if (error_ != cudaSuccess) {                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(error_));                         \
      std::exit(1);                                                     \
    }                                                                   \
  } while (0)

namespace {

// The longest row DeviceBatchedTopK takes (its dispatch is sized from this compile-time bound).
constexpr int kMaxBatchedRow = 8192;
// The most streams the DeviceTopK-a-row calls are spread over (rows beyond take turns).
constexpr int kMaxLanes = 32;

struct Shape {
  const char* dtype;  // "float32" or "bfloat16"
  int rows;
  int n;
  int k;
  bool causal;
};

// Issue 16's table (bf16 rows there are topk_bf16's 16384-wide rows at k = 512), then two rows
// short enough for DeviceBatchedTopK.
const Shape kShapes[] = {
    {"float32", 1, 32768, 2048, false},   {"float32", 4, 32768, 2048, false},
    {"float32", 1, 131072, 2048, false},  {"float32", 32, 131072, 2048, false},
    {"float32", 43, 430080, 2048, true},  {"bfloat16", 1, 16384, 512, false},
    {"bfloat16", 128, 16384, 512, false}, {"bfloat16", 2048, 16384, 512, false},
    {"float32", 32, 8192, 2048, false},   {"bfloat16", 128, 8192, 512, false},
};

// An unsigned key with the float's order (for finite values): flip every bit of negatives,
// the sign bit of the rest.
uint32_t OrderedKey32(uint32_t bits) {
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}
uint16_t OrderedKey16(uint16_t bits) {
  return (bits & 0x8000u) ? static_cast<uint16_t>(~bits) : static_cast<uint16_t>(bits | 0x8000u);
}

template <typename Key>
std::vector<Key> RandomKeys(size_t count, bool sixteen_bit, uint32_t seed) {
  std::mt19937 generator(seed);
  std::normal_distribution<float> normal;
  std::vector<Key> keys(count);
  for (size_t i = 0; i < count; ++i) {
    uint32_t bits;
    const float value = normal(generator);
    std::memcpy(&bits, &value, 4);
    if constexpr (sizeof(Key) == 2) {
      keys[i] = OrderedKey16(static_cast<uint16_t>(bits >> 16));  // bf16 by truncation
    } else {
      (void)sixteen_bit;
      keys[i] = OrderedKey32(bits);
    }
  }
  return keys;
}

struct Timing {
  double median_us;
  double min_us;
  size_t temp_bytes;
  bool checked;
  bool batched;  // DeviceBatchedTopK, else one DeviceTopK a row
};

template <typename Key>
Timing RunShape(const Shape& shape, int seed) {
  const size_t n = shape.n, rows = shape.rows, k = shape.k;
  std::vector<Key> host = RandomKeys<Key>(rows * n, sizeof(Key) == 2, seed);
  std::vector<int32_t> lengths(rows);
  for (size_t r = 0; r < rows; ++r)
    lengths[r] = shape.causal ? static_cast<int32_t>(n - (rows - 1 - r)) : static_cast<int32_t>(n);

  Key *keys_in, *keys_out;
  int32_t *columns_out, *device_lengths;
  CHECK(cudaMalloc(&keys_in, rows * n * sizeof(Key)));
  CHECK(cudaMalloc(&keys_out, rows * k * sizeof(Key)));
  CHECK(cudaMalloc(&columns_out, rows * k * sizeof(int32_t)));
  CHECK(cudaMalloc(&device_lengths, rows * sizeof(int32_t)));
  CHECK(cudaMemcpy(keys_in, host.data(), rows * n * sizeof(Key), cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(device_lengths, lengths.data(), rows * sizeof(int32_t), cudaMemcpyHostToDevice));

  // Row r's keys start at keys_in + r * n; its outputs at r * k; the values in are the columns.
  auto rows_in = cuda::make_strided_iterator(cuda::make_counting_iterator(keys_in), n);
  auto rows_out = cuda::make_strided_iterator(cuda::make_counting_iterator(keys_out), k);
  auto columns_in = cuda::make_constant_iterator(cuda::make_counting_iterator(int32_t{0}));
  auto columns_rows_out = cuda::make_strided_iterator(cuda::make_counting_iterator(columns_out), k);
  auto sizes =
      cuda::args::deferred_sequence{device_lengths, cuda::args::bounds<1, kMaxBatchedRow>()};
  auto segments = cuda::args::immediate{static_cast<int64_t>(rows)};
  auto env = cuda::std::execution::env{cuda::execution::require(
      cuda::execution::determinism::not_guaranteed, cuda::execution::tie_break::unspecified,
      cuda::execution::output_ordering::unsorted)};

  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  auto stream_env = cuda::std::execution::env{env, cuda::stream_ref{stream}};
  const bool batched = n <= kMaxBatchedRow;
  // DeviceTopK a row: the rows spread over `lanes` streams forked from `stream` and joined back
  // (a graph of parallel branches once captured), each lane with its own temporary storage.
  const int lanes = batched ? 1 : static_cast<int>(std::min<size_t>(rows, kMaxLanes));
  std::vector<cudaStream_t> lane_streams(lanes);
  std::vector<cudaEvent_t> lane_done(lanes);
  for (int lane = 0; lane < lanes; ++lane) {
    CHECK(cudaStreamCreateWithFlags(&lane_streams[lane], cudaStreamNonBlocking));
    CHECK(cudaEventCreateWithFlags(&lane_done[lane], cudaEventDisableTiming));
  }
  cudaEvent_t forked;
  CHECK(cudaEventCreateWithFlags(&forked, cudaEventDisableTiming));
  auto top_k_of_row = [&](size_t r, void* temp, size_t& bytes, cudaStream_t on) {
    CHECK(cub::DeviceTopK::MaxPairs(temp, bytes, keys_in + r * n, keys_out + r * k,
                                    cuda::make_counting_iterator(int32_t{0}), columns_out + r * k,
                                    lengths[r], static_cast<int>(k),
                                    cuda::std::execution::env{env, cuda::stream_ref{on}}));
  };
  size_t temp_bytes = 0;
  if (batched) {
    CHECK(cub::DeviceBatchedTopK::MaxPairs(nullptr, temp_bytes, rows_in, rows_out, columns_in,
                                           columns_rows_out, sizes, static_cast<int>(k), segments,
                                           stream_env));
  } else {
    for (size_t r = 0; r < rows; ++r) {
      size_t row_bytes = 0;
      top_k_of_row(r, nullptr, row_bytes, stream);
      temp_bytes = std::max(temp_bytes, row_bytes);
    }
  }
  const size_t temp_stride = (std::max<size_t>(temp_bytes, 1) + 255) / 256 * 256;
  char* temp;
  CHECK(cudaMalloc(&temp, temp_stride * lanes));
  auto call = [&] {
    if (batched) {
      CHECK(cub::DeviceBatchedTopK::MaxPairs(temp, temp_bytes, rows_in, rows_out, columns_in,
                                             columns_rows_out, sizes, static_cast<int>(k), segments,
                                             stream_env));
      return;
    }
    CHECK(cudaEventRecord(forked, stream));
    for (int lane = 0; lane < lanes; ++lane) {
      CHECK(cudaStreamWaitEvent(lane_streams[lane], forked, 0));
      for (size_t r = lane; r < rows; r += lanes) {  // a lane's rows run in its stream's order
        size_t bytes = temp_bytes;
        top_k_of_row(r, temp + lane * temp_stride, bytes, lane_streams[lane]);
      }
      CHECK(cudaEventRecord(lane_done[lane], lane_streams[lane]));
      CHECK(cudaStreamWaitEvent(stream, lane_done[lane], 0));
    }
  };

  // The check: each row's selected keys are the k largest of its first length keys.
  call();
  CHECK(cudaStreamSynchronize(stream));
  std::vector<Key> got(rows * k);
  CHECK(cudaMemcpy(got.data(), keys_out, rows * k * sizeof(Key), cudaMemcpyDeviceToHost));
  bool checked = true;
  for (size_t r = 0; r < rows && checked; ++r) {
    std::vector<Key> row(host.begin() + r * n, host.begin() + r * n + lengths[r]);
    std::sort(row.begin(), row.end(), std::greater<Key>());
    std::vector<Key> mine(got.begin() + r * k, got.begin() + (r + 1) * k);
    std::sort(mine.begin(), mine.end(), std::greater<Key>());
    checked = std::equal(mine.begin(), mine.end(), row.begin());
  }

  // Graph replay: a batch of `per_batch` replays between two events, `batches` batches.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  call();
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  for (int i = 0; i < 20; ++i) CHECK(cudaGraphLaunch(exec, stream));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  constexpr int per_batch = 20, batches = 15;
  std::vector<double> us;
  for (int b = 0; b < batches; ++b) {
    CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < per_batch; ++i) CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    us.push_back(1000.0 * ms / per_batch);
  }
  std::sort(us.begin(), us.end());
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaStreamDestroy(stream));
  for (int lane = 0; lane < lanes; ++lane) {
    CHECK(cudaStreamDestroy(lane_streams[lane]));
    CHECK(cudaEventDestroy(lane_done[lane]));
  }
  CHECK(cudaEventDestroy(forked));
  for (void* p :
       {static_cast<void*>(keys_in), static_cast<void*>(keys_out), static_cast<void*>(columns_out),
        static_cast<void*>(device_lengths), static_cast<void*>(temp)})
    CHECK(cudaFree(p));
  return {us[us.size() / 2], us.front(), temp_bytes, checked, batched};
}

}  // namespace

int main(int argc, char** argv) {
  const char* json_path = nullptr;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--json") json_path = argv[i + 1];
  std::string json = "[\n";
  std::printf("%-9s %-14s %-5s %-7s %-20s %10s %10s %12s %s\n", "dtype", "rows x n", "k", "lengths",
              "cub", "median us", "min us", "temp bytes", "keys check");
  int seed = 0;
  for (const Shape& shape : kShapes) {
    const Timing t = std::string(shape.dtype) == "float32" ? RunShape<uint32_t>(shape, ++seed)
                                                           : RunShape<uint16_t>(shape, ++seed);
    const std::string dims = std::to_string(shape.rows) + "x" + std::to_string(shape.n);
    const char* peer = t.batched ? "DeviceBatchedTopK" : "DeviceTopK per row";
    std::printf("%-9s %-14s %-5d %-7s %-20s %10.1f %10.1f %12zu %s\n", shape.dtype, dims.c_str(),
                shape.k, shape.causal ? "causal" : "full", peer, t.median_us, t.min_us,
                t.temp_bytes, t.checked ? "ok" : "MISMATCH");
    char record[400];
    std::snprintf(record, sizeof(record),
                  "  {\"peer\": \"cub::%s\", \"dtype\": \"%s\", \"rows\": %d, "
                  "\"n\": %d, \"k\": %d, \"lengths\": \"%s\", \"median_us\": %.2f, "
                  "\"min_us\": %.2f, \"keys_checked\": %s}",
                  t.batched ? "DeviceBatchedTopK" : "DeviceTopK per row", shape.dtype, shape.rows,
                  shape.n, shape.k, shape.causal ? "causal" : "full", t.median_us, t.min_us,
                  t.checked ? "true" : "false");
    json += std::string(seed > 1 ? ",\n" : "") + record;
  }
  json += "\n]\n";
  if (json_path) {
    FILE* file = std::fopen(json_path, "w");
    if (!file) return 1;
    std::fputs(json.c_str(), file);
    std::fclose(file);
  }
  return 0;
}
