// Standalone check and timing of the Hopper indexer_logits kernel (no JAX needed):
//   nvcc -O3 -std=c++17 --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
//     -DJAX_TOPK_INDEXER_WGMMA_SM90A -Icuda benches/probes/indexer_wgmma_probe.cu -o probe
//   ./probe            # adversarial cases against a float64 host reference, then timings
// The bound is SPEC section 9's: 2e-5 * sum_h |w| * |scale| * sum_d |q k|; masked columns must be
// -inf exactly, every output written (poisoned with NaN first), two runs bitwise equal.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "../../cuda/kernels/indexer_logits_wgmma.cu"

using jax_topk::IndexerProblem;

#define CHECK(call)                                                                        \
  do {                                                                                     \
    cudaError_t e_ = (call);                                                               \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr int H = 64, D = 128;

uint16_t ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}
float FromBf16(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &bits, 4);
  return x;
}

struct HostData {
  int64_t batch, m, n;
  std::vector<uint16_t> q, keys;
  std::vector<float> weights, scales;  // scales empty: none
  std::vector<int32_t> lengths;        // empty: none
};

enum Values { kRandom, kAllNegative, kZeroHeadsRepeatedKeys, kLarge };
enum Lengths { kNone, kAdversarial, kCausal };

HostData Make(int64_t batch, int64_t m, int64_t n, Values values, Lengths lengths, bool scales,
              uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  HostData d{batch, m, n};
  d.q.resize(batch * m * H * D);
  d.keys.resize(batch * n * D);
  d.weights.resize(batch * m * H);
  const float q_mag = values == kLarge ? 256.0f : 1.0f, k_mag = values == kLarge ? 512.0f : 1.0f;
  for (int64_t i = 0; i < (int64_t)d.q.size(); ++i) {
    float x = u(rng) * q_mag;
    if (values == kAllNegative) x = std::fabs(x);
    if (values == kZeroHeadsRepeatedKeys && ((i / D) % H) % 3 == 0) x = 0.0f;
    d.q[i] = ToBf16(x);
  }
  for (int64_t i = 0; i < (int64_t)d.keys.size(); ++i) {
    float x = u(rng) * k_mag;
    if (values == kAllNegative) x = -std::fabs(x);
    d.keys[i] = ToBf16(x);
  }
  if (values == kZeroHeadsRepeatedKeys) {
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t s = 0; s < n; ++s)
        for (int k = 0; k < D; ++k) d.keys[(b * n + s) * D + k] = d.keys[(b * n + s % 7) * D + k];
  }
  for (auto& w : d.weights) {
    w = u(rng) * (values == kLarge ? 1000.0f : 1.0f);
    if (rng() % 8 == 0) w = 0.0f;
  }
  if (scales) {
    d.scales.resize(batch * n);
    for (auto& s : d.scales)
      s = (rng() % 10 == 0) ? -0.5f * std::fabs(u(rng)) : 0.01f + std::fabs(u(rng));
  }
  if (lengths == kAdversarial) {
    const int64_t picks[] = {-5, 0, 1, 63, 64, 65, n - 1, n, n + 10, 127, 128, 129};
    d.lengths.resize(batch * m);
    for (int64_t i = 0; i < batch * m; ++i)
      d.lengths[i] = (int32_t)(i % 3 == 2 ? (int64_t)(rng() % (n + 1)) : picks[rng() % 12]);
  } else if (lengths == kCausal) {
    d.lengths.resize(batch * m);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < m; ++t) d.lengths[b * m + t] = (int32_t)(n - m + t + 1);
  }
  return d;
}

struct Device {
  void *q = nullptr, *keys = nullptr;
  float *weights = nullptr, *scales = nullptr, *out = nullptr;
  int32_t* lengths = nullptr;
};

template <typename T>
T* Upload(const std::vector<T>& v) {
  if (v.empty()) return nullptr;
  T* p;
  CHECK(cudaMalloc(&p, v.size() * sizeof(T)));
  CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

IndexerProblem ProblemOf(const HostData& d, const Device& dev) {
  IndexerProblem p;
  p.batch = d.batch;
  p.queries = d.m;
  p.heads = H;
  p.head_dim = D;
  p.keys_count = d.n;
  p.q = dev.q;
  p.keys = dev.keys;
  p.weights = dev.weights;
  p.key_scales = dev.scales;
  p.lengths = dev.lengths;
  p.logits = dev.out;
  return p;
}

// float64 reference and bound of (b, t, s); ref = -inf when masked.
void Reference(const HostData& d, int64_t b, int64_t t, int64_t s, double* ref, double* bound) {
  int64_t length = d.lengths.empty()
                       ? d.n
                       : std::min<int64_t>(std::max<int64_t>(d.lengths[b * d.m + t], 0), d.n);
  if (s >= length) {
    *ref = -INFINITY;
    *bound = 0;
    return;
  }
  const double scale = d.scales.empty() ? 1.0 : d.scales[b * d.n + s];
  const uint16_t* k = &d.keys[(b * d.n + s) * D];
  double sum = 0, mag = 0;
  for (int h = 0; h < H; ++h) {
    const uint16_t* qq = &d.q[((b * d.m + t) * H + h) * D];
    double dot = 0, abs_dot = 0;
    for (int i = 0; i < D; ++i) {
      const double prod = (double)FromBf16(qq[i]) * FromBf16(k[i]);
      dot += prod;
      abs_dot += std::fabs(prod);
    }
    const double w = d.weights[(b * d.m + t) * H + h];
    sum += w * std::max(0.0, scale * dot);
    mag += std::fabs(w) * std::fabs(scale) * abs_dot;
  }
  *ref = sum;
  *bound = 2e-5 * mag;
}

// Checks all rows (or a sample unless `full`) at every `column_step`-th column and the last;
// returns failures.
int64_t Check(const char* name, const HostData& d, bool full, int column_step) {
  Device dev;
  dev.q = Upload(d.q);
  dev.keys = Upload(d.keys);
  dev.weights = Upload(d.weights);
  dev.scales = Upload(d.scales);
  dev.lengths = Upload(d.lengths);
  const int64_t out_count = d.batch * d.m * d.n;
  CHECK(cudaMalloc(&dev.out, out_count * 4));
  std::vector<float> first(out_count), second(out_count);
  for (int run = 0; run < 2; ++run) {
    CHECK(cudaMemset(dev.out, 0xFF, out_count * 4));  // NaN: an unwritten element fails
    IndexerProblem p = ProblemOf(d, dev);
    if (!jax_topk::IndexerLogitsWgmmaSupports(p, 0)) {
      std::printf("%s: not supported\n", name);
      return 1;
    }
    CHECK(jax_topk::LaunchIndexerLogitsWgmma(p, 0));
    CHECK(cudaDeviceSynchronize());
    CHECK(cudaMemcpy(run == 0 ? first.data() : second.data(), dev.out, out_count * 4,
                     cudaMemcpyDeviceToHost));
  }
  const bool same = std::memcmp(first.data(), second.data(), out_count * 4) == 0;
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < d.batch * d.m; ++r)
    if (full || r < 3 || r >= d.batch * d.m - 3 || r % 61 == 0) rows.push_back(r);
  const int threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<int64_t> fails(threads, 0), checked(threads, 0);
  std::vector<double> worst(threads, 0);
  std::vector<std::thread> pool;
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back([&, w] {
      for (size_t i = w; i < rows.size(); i += threads) {
        const int64_t b = rows[i] / d.m, t = rows[i] % d.m;
        auto check_one = [&](int64_t s) {
          double ref, bound;
          Reference(d, b, t, s, &ref, &bound);
          const float got = first[(b * d.m + t) * d.n + s];
          bool ok;
          if (std::isinf(ref)) {
            ok = std::isinf(got) && got < 0;
          } else {
            const double err = std::fabs((double)got - ref);
            ok = err <= bound;
            if (bound > 0) worst[w] = std::max(worst[w], err / bound);
          }
          ++checked[w];
          if (!ok && fails[w]++ < 3)
            std::printf("  %s mismatch b=%lld t=%lld s=%lld got %.9g ref %.9g bound %.3g\n", name,
                        (long long)b, (long long)t, (long long)s, got, ref, bound);
        };
        for (int64_t s = 0; s < d.n; s += column_step) check_one(s);
        if ((d.n - 1) % column_step != 0) check_one(d.n - 1);
      }
    });
  }
  for (auto& th : pool) th.join();
  int64_t total_fails = 0, total_checked = 0;
  double worst_ratio = 0;
  for (int w = 0; w < threads; ++w) {
    total_fails += fails[w];
    total_checked += checked[w];
    worst_ratio = std::max(worst_ratio, worst[w]);
  }
  std::printf("%-34s checked %9lld  fails %lld  worst err/bound %.3f  deterministic %s\n", name,
              (long long)total_checked, (long long)total_fails, worst_ratio, same ? "yes" : "NO");
  cudaFree(dev.q);
  cudaFree(dev.keys);
  cudaFree(dev.weights);
  cudaFree(dev.scales);
  cudaFree(dev.lengths);
  cudaFree(dev.out);
  return total_fails + (same ? 0 : 1);
}

void Time(int64_t m, int64_t n, bool causal, FILE* log) {
  HostData d = Make(1, m, n, kRandom, causal ? kCausal : kNone, false, 7);
  const int64_t input_bytes = (int64_t)(d.q.size() + d.keys.size()) * 2;
  const int sets = (int)std::min<int64_t>(8, std::max<int64_t>(1, (256 << 20) / input_bytes));
  std::vector<Device> devs(sets);
  for (auto& dev : devs) {
    dev.q = Upload(d.q);
    dev.keys = Upload(d.keys);
    dev.weights = Upload(d.weights);
    dev.lengths = Upload(d.lengths);
    CHECK(cudaMalloc(&dev.out, m * n * 4));
  }
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  // Launches back to back between two events (host launch time hidden), rotating input sets
  // so that the keys come from memory, not L2; median of the per-launch means.
  constexpr int kLaunchesPerSample = 10;
  std::vector<float> times;
  for (int sample = 0; sample < 12; ++sample) {
    CHECK(cudaEventRecord(start));
    for (int i = 0; i < kLaunchesPerSample; ++i) {
      IndexerProblem p = ProblemOf(d, devs[(sample * kLaunchesPerSample + i) % sets]);
      CHECK(jax_topk::LaunchIndexerLogitsWgmma(p, 0));
    }
    CHECK(cudaEventRecord(stop));
    CHECK(cudaEventSynchronize(stop));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (sample >= 2) times.push_back(ms * 1000.0f / kLaunchesPerSample);
  }
  std::sort(times.begin(), times.end());
  const double median_us = times[times.size() / 2];
  double visible = 0;
  for (int64_t t = 0; t < m; ++t)
    visible +=
        causal ? (double)std::min<int64_t>(n, std::max<int64_t>(0, d.lengths[t])) : (double)n;
  const double flops = 2.0 * visible * H * D;
  const double tflops = flops / (median_us * 1e-6) / 1e12;
  const double compute_floor_us = flops / 800e12 * 1e6;
  const double read_floor_us = (double)n * D * 2 / 4.3e12 * 1e6;
  const double write_floor_us = (double)m * n * 4 / 4.3e12 * 1e6;
  char line[256];
  std::snprintf(line, sizeof line,
                "%5lld x %-7lld %-6s median %8.1f us (min %8.1f)  %6.1f TFLOP/s (%4.1f%% of 800)  "
                "compute floor %8.1f us  key-read floor %5.1f us  write %6.1f us  sets %d\n",
                (long long)m, (long long)n, causal ? "causal" : "", median_us, times[0], tflops,
                100 * tflops / 800, compute_floor_us, read_floor_us, write_floor_us, sets);
  std::fputs(line, stdout);
  if (log) std::fputs(line, log);
  for (auto& dev : devs) {
    cudaFree(dev.q);
    cudaFree(dev.keys);
    cudaFree(dev.weights);
    cudaFree(dev.lengths);
    cudaFree(dev.out);
  }
}

int main(int argc, char** argv) {
  int64_t fails = 0;
  // "time": timings only; "small": small checks only; "shape M N": one shape's timing.
  const char* mode = argc > 1 ? argv[1] : "";
  const bool timing_only = std::strcmp(mode, "time") == 0, small = std::strcmp(mode, "small") == 0;
  if (std::strcmp(mode, "shape") == 0 && argc == 4) {  // one shape's timing (for ncu)
    Time(std::atoll(argv[2]), std::atoll(argv[3]), false, nullptr);
    return 0;
  }
  if (!timing_only) {
    fails += Check("random 37x1000 adversarial L",
                   Make(1, 37, 1000, kRandom, kAdversarial, false, 1), true, 1);
    fails +=
        Check("random 37x1000 scales", Make(1, 37, 1000, kRandom, kAdversarial, true, 2), true, 1);
    fails += Check("all negative 13x777", Make(1, 13, 777, kAllNegative, kNone, false, 3), true, 1);
    fails += Check("zero heads, repeated keys 9x300",
                   Make(1, 9, 300, kZeroHeadsRepeatedKeys, kAdversarial, false, 4), true, 1);
    fails += Check("large 6x513", Make(1, 6, 513, kLarge, kNone, true, 5), true, 1);
    fails += Check("M=1 N=5000", Make(1, 1, 5000, kRandom, kNone, false, 6), true, 1);
    fails += Check("M=1 N=64 L adversarial b=5", Make(5, 1, 64, kRandom, kAdversarial, false, 7),
                   true, 1);
    fails += Check("M=2 N=65", Make(1, 2, 65, kRandom, kAdversarial, true, 8), true, 1);
    fails += Check("M=3 N=1", Make(1, 3, 1, kRandom, kNone, false, 9), true, 1);
    fails += Check("batch 3, 5x200", Make(3, 5, 200, kRandom, kAdversarial, false, 10), true, 1);
    fails += Check("causal 130x4100", Make(1, 130, 4100, kRandom, kCausal, false, 11), true, 3);
    if (!small) {
      fails += Check("M=1 N=131072 (rows sampled)", Make(1, 1, 131072, kRandom, kNone, false, 12),
                     true, 7);
      fails += Check("causal 2048x32768 (sampled)",
                     Make(1, 2048, 32768, kRandom, kCausal, false, 13), false, 97);
    }
    std::printf("correctness: %s\n", fails == 0 ? "PASS" : "FAIL");
    if (small) return fails == 0 ? 0 : 1;
  }
  FILE* log = nullptr;
  if (const char* out = std::getenv("OUT")) {
    std::string path = std::string(out) + "/timings.txt";
    log = std::fopen(path.c_str(), "w");
  }
  Time(1, 131072, false, log);
  Time(32, 131072, false, log);
  Time(128, 65536, false, log);
  Time(512, 65536, false, log);
  Time(2048, 32768, true, log);
  if (log) std::fclose(log);
  return fails == 0 ? 0 : 1;
}
