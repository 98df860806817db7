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
// --check-only skips the timings (for compute-sanitizer --tool memcheck, which the cases are
//    sized for: the scores end at their allocation's end). Exit status 0 when all cases pass.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/topk_common.h"
#include "common/topk_problem.h"
#include "kernels/topk_cuda.h"
#include "small_rows_reference.h"

namespace jax_topk {
namespace small_rows_check {

// ---- The GPU checks. ----

#define CHECK_CUDA(call)                                                                        \
  do {                                                                                          \
    const cudaError_t status = (call);                                                          \
    if (status != cudaSuccess) {                                                                \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(status)); \
      exit(2);                                                                                  \
    }                                                                                           \
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
  CHECK_CUDA(
      cudaMemcpy(scores_allocation + offset, p.scores.data(), score_bytes, cudaMemcpyHostToDevice));
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
    const Case base = c;
    // (sorted, values, lengths); the rows without lengths but with values are what top_k
    // passes (the kernel's plain instances), both orders.
    constexpr bool kVariants[5][3] = {{true, true, true},
                                      {false, true, true},
                                      {true, true, false},
                                      {false, false, true},
                                      {false, true, false}};
    for (const auto& variant : kVariants) {
      c.sorted = variant[0];
      c.with_values = variant[1];
      c.with_lengths = variant[2];
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
    // Rows ending inside a block and inside a warp (where two rows share a warp, its second
    // half has no row), rows without lengths and with values: what top_k passes.
    for (int fewer_rows : {1, 3, 7}) {
      c = base;
      c.sorted = fewer_rows != 3;
      c.with_lengths = false;
      c.fewer_rows = fewer_rows;
      run(c);
    }
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
  printf(
      "kernel vs reference: %lld cases PASS, %lld FAIL; width > %d refused: %s, k > %d refused: "
      "%s\n",
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
    CHECK_CUDA(
        cudaMemcpy(scores + i * input_bytes, host.data(), input_bytes, cudaMemcpyHostToDevice));
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
  printf(
      "time %-8s [%6lld, %4lld] k=%2d sorted=%d values=%d: %7.2f us a call (floor %6.2f us, "
      "%.2fx; %d inputs rotated)\n",
      TypeName(type), static_cast<long long>(rows), static_cast<long long>(width), k, sorted,
      with_values, us, floor_us, us / floor_us, inputs);
  CHECK_CUDA(cudaFree(scores));
  CHECK_CUDA(cudaFree(out));
  CHECK_CUDA(cudaFree(values));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
}

// Bytes read plus written per microsecond by a large device-to-device copy (benches/README.md's
// floor).
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
  for (int i = 0; i < kCopies; ++i)
    CHECK_CUDA(cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice));
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

}  // namespace small_rows_check
}  // namespace jax_topk

int main(int argc, char** argv) {
  using namespace jax_topk;
  using namespace jax_topk::small_rows_check;
  if (argc > 1 && std::string(argv[1]) == "--reference-only") return CheckReference();
  const int reference_status = CheckReference();
  const int kernel_status = CheckKernel();
  if (argc > 1 && std::string(argv[1]) == "--check-only") return reference_status | kernel_status;
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
