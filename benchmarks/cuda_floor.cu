// The CUDA floor of one decode step's output copies (issue 24): what issuing a step's three
// logprob copies and their event costs the host with no Python at all, in the ways the CUDA
// runtime offers, and what the host then waits. Plain CUDA runtime, no framework.
//
//   nvcc -O2 -o cuda_floor benchmarks/cuda_floor.cu && ./cuda_floor [steps]
//
// Per way, GPU idle, B=128 and B=1024 rows of K+1=21 logprobs (ids int64, logprobs fp32, ranks
// int64): "issue" = host time of the calls that put the copies and the event on the stream;
// "issue+wait" = that plus cudaEventSynchronize (the copies' DMA included). Medians in us.
// Last, FD 2.5's per-step pinned path at B=1024 (cudaFreeHost of last step's buffers, cudaHostAlloc,
// the copies, an event waited on) timed in this process before any batch call and after them: does
// using cudaMemcpyBatchAsync slow the process's pinned allocations down?
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x) do { cudaError_t ck_ = (x); if (ck_ != cudaSuccess) { \
  std::printf("%s: %s\n", #x, cudaGetErrorString(ck_)); std::exit(1); } } while (0)

struct Gather { const char* src[3]; size_t off[3]; size_t n[3]; };

__global__ void gather3(Gather g, char* dst) {
  for (int k = 0; k < 3; ++k) {
    const size_t n8 = g.n[k] / 8;
    const unsigned long long* s = reinterpret_cast<const unsigned long long*>(g.src[k]);
    unsigned long long* d = reinterpret_cast<unsigned long long*>(dst + g.off[k]);
    for (size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n8; i += gridDim.x * blockDim.x) d[i] = s[i];
  }
}

static double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// FD 2.5's per-step pinned path (B=1024 K=20), 250 steps after 50: median and p90 in us.
static void per_step_pinned(const char* when, cudaStream_t stream) {
  size_t n[3] = {1024 * 21 * 8ul, 1024 * 21 * 4ul, 1024 * 8ul};
  void* src[3];
  for (int k = 0; k < 3; ++k) CK(cudaMalloc(&src[k], n[k]));
  std::vector<double> t;
  void* prev[3] = {nullptr, nullptr, nullptr};
  for (int s = 0; s < 300; ++s) {
    double t0 = now_us();
    void* p[3];
    for (int k = 0; k < 3; ++k) if (prev[k]) CK(cudaFreeHost(prev[k]));
    for (int k = 0; k < 3; ++k) CK(cudaHostAlloc(&p[k], n[k], 0));
    for (int k = 0; k < 3; ++k) CK(cudaMemcpyAsync(p[k], src[k], n[k], cudaMemcpyDeviceToHost, stream));
    cudaEvent_t e;
    CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CK(cudaEventRecord(e, stream));
    CK(cudaEventSynchronize(e));
    CK(cudaEventDestroy(e));
    if (s >= 50) t.push_back(now_us() - t0);
    for (int k = 0; k < 3; ++k) prev[k] = p[k];
  }
  for (int k = 0; k < 3; ++k) { CK(cudaFreeHost(prev[k])); CK(cudaFree(src[k])); }
  std::sort(t.begin(), t.end());
  std::printf("FD 2.5's per-step pinned path, B=1024, %-36s median %7.2f us, p90 %7.2f us\n", when, t[t.size() / 2],
              t[t.size() * 9 / 10]);
}

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 2000;
  cudaStream_t stream;
  CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming | cudaEventBlockingSync));
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt); cudaDriverGetVersion(&drv);
  std::printf("cuda_floor: runtime %d, driver %d, %d steps per way (after 200 warm-up)\n", rt, drv, steps);
  per_step_pinned("before any batch call:", stream);
  for (int rows : {128, 1024}) {
    size_t n[3] = {rows * 21 * 8ul, rows * 21 * 4ul, rows * 8ul};
    size_t total = n[0] + n[1] + n[2];
    void* src[3]; void* dst[3]; char* stage; char* pinned_all;
    for (int k = 0; k < 3; ++k) { CK(cudaMalloc(&src[k], n[k])); CK(cudaMemset(src[k], k + 1, n[k])); CK(cudaHostAlloc(&dst[k], n[k], 0)); }
    CK(cudaMalloc(&stage, total)); CK(cudaHostAlloc(&pinned_all, total, 0));
    std::vector<char> pageable(total);
    Gather g; size_t off = 0;
    for (int k = 0; k < 3; ++k) { g.src[k] = (const char*)src[k]; g.off[k] = off; g.n[k] = n[k]; off += n[k]; }
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.srcLocHint.type = cudaMemLocationTypeDevice; attr.srcLocHint.id = 0;
    attr.dstLocHint.type = cudaMemLocationTypeHost;
    size_t attr_idx = 0;
    const void* srcs[3] = {src[0], src[1], src[2]};
    bool batch_ok = true;
    std::printf("B=%d K=20 (%zu bytes per step)\n", rows, total);
    const char* names[] = {"3 x cudaMemcpyAsync + cudaEventRecord", "cudaMemcpyBatchAsync(3) + cudaEventRecord",
                           "gather kernel + 1 cudaMemcpyAsync + record", "FD 2.4: 3 x (cudaMemcpyAsync pageable + sync)",
                           "cudaEventRecord alone", "cudaEventSynchronize, event complete", "cudaEventQuery, event complete"};
    for (int way = 0; way < 7; ++way) {
      std::vector<double> issue, both;
      for (int s = 0; s < steps + 200; ++s) {
        double t0 = now_us();
        cudaError_t e = cudaSuccess;
        switch (way) {
          case 0: for (int k = 0; k < 3; ++k) e = cudaMemcpyAsync(dst[k], src[k], n[k], cudaMemcpyDeviceToHost, stream);
                  cudaEventRecord(ev, stream); break;
          case 1: e = cudaMemcpyBatchAsync(dst, srcs, n, 3, &attr, &attr_idx, 1, stream);
                  cudaEventRecord(ev, stream); break;
          case 2: gather3<<<8, 256, 0, stream>>>(g, stage);
                  e = cudaMemcpyAsync(pinned_all, stage, total, cudaMemcpyDeviceToHost, stream);
                  cudaEventRecord(ev, stream); break;
          case 3: for (int k = 0; k < 3; ++k) { e = cudaMemcpyAsync(pageable.data() + g.off[k], src[k], n[k], cudaMemcpyDeviceToHost, stream);
                  cudaStreamSynchronize(stream); } break;
          case 4: cudaEventRecord(ev, stream); break;
          case 5: cudaEventSynchronize(ev); break;
          case 6: cudaEventQuery(ev); break;
        }
        double t1 = now_us();
        if (way < 5) cudaEventSynchronize(ev);
        double t2 = now_us();
        if (e != cudaSuccess) { if (way == 1) batch_ok = false; else CK(e); }
        if (s >= 200) { issue.push_back(t1 - t0); both.push_back(t2 - t0); }
      }
      if (way == 1 && !batch_ok) { std::printf("  %-48s unavailable\n", names[way]); cudaGetLastError(); continue; }
      std::printf("  %-48s issue %7.2f us   issue+wait %7.2f us\n", names[way], median(issue), median(both));
    }
    // every way copies the same bytes: check the batch and the gather against the plain copies
    std::vector<char> a(total), b(total);
    for (int k = 0; k < 3; ++k) std::copy((char*)dst[k], (char*)dst[k] + n[k], a.begin() + g.off[k]);
    std::copy(pinned_all, pinned_all + total, b.begin());
    std::printf("  gather copy equals the plain copies: %s\n", a == b ? "yes" : "NO");
    for (int k = 0; k < 3; ++k) { cudaFree(src[k]); cudaFreeHost(dst[k]); }
    cudaFree(stage); cudaFreeHost(pinned_all);
  }
  per_step_pinned("after the batch calls above:", stream);
  return 0;
}
