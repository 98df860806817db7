// What the direct-launch probes share (f32_cluster_stamps.cu, bf16_rows_variants.cu): CHECK, which
// stops the probe on a CUDA error, and GraphUs, the time a launch takes in a CUDA graph of
// back-to-back launches (no host launch overhead between them, as in an XLA command buffer).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CHECK(call)                                                                      \
  do {                                                                                   \
    const cudaError_t error = (call);                                                    \
    if (error != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(error)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

// us a launch: `launch(i)` captured `count` times into one graph, replayed 8 times; the median of
// the last 7 (the first warms up).
template <class Launch>
float GraphUs(cudaStream_t stream, int count, const Launch& launch) {
  cudaGraph_t graph;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < count; ++i) launch(i);
  CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  std::vector<float> times;
  for (int repeat = 0; repeat < 8; ++repeat) {
    CHECK(cudaEventRecord(start, stream));
    CHECK(cudaGraphLaunch(exec, stream));
    CHECK(cudaEventRecord(stop, stream));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (repeat > 0) times.push_back(ms * 1000.0f / count);
  }
  std::sort(times.begin(), times.end());
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return times[times.size() / 2];
}
