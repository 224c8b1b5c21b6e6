/* A stand-in for libcudart with the calls runtime/cudart.py binds, for CPU tests of the ctypes
 * layer and of fdac_d2h_batch: host memory, memmove copies, events that are counters. Every copy
 * and record is logged (fake_log), and a call can be made to fail (fake_fail_*). Compiled with
 * -DFAKE_BATCH_ABI=13 or 12 it also has cudaMemcpyBatchAsync with CUDA 13's or CUDA 12.8's
 * signature (and reports that runtime version); without, none (as CUDA before 12.8). Written for
 * this project's tests; not NVIDIA code. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_LOG 256
/* kind 1: copy (dst, src, nbytes, stream), kind 2: record (event, stream), kind 3: a batch call
 * (count, 0, 0, stream), logged before its copies */
struct fake_entry { int kind; uintptr_t a, b, c, stream; };
struct fake_entry fake_log[FAKE_LOG];
int fake_log_size = 0;
int fake_fail_copy = -1;   /* fail the copy with this index in the log's order of copies (-1: none) */
int fake_fail_record = 0;  /* fail every record */
int fake_copies = 0;
static uintptr_t next_event = 0;

static void note(int kind, uintptr_t a, uintptr_t b, uintptr_t c, uintptr_t stream) {
  if (fake_log_size < FAKE_LOG) {
    struct fake_entry e = {kind, a, b, c, stream};
    fake_log[fake_log_size++] = e;
  }
}

int cudaHostAlloc(void** ptr, size_t nbytes, unsigned flags) { *ptr = malloc(nbytes); return *ptr ? 0 : 2; }
int cudaFreeHost(void* ptr) { free(ptr); return 0; }
int cudaMemcpyAsync(void* dst, const void* src, size_t nbytes, int kind, void* stream) {
  if (fake_copies++ == fake_fail_copy) return 700;
  memmove(dst, src, nbytes);
  note(1, (uintptr_t)dst, (uintptr_t)src, nbytes, (uintptr_t)stream);
  return 0;
}
int cudaMemcpy(void* dst, const void* src, size_t nbytes, int kind) { memmove(dst, src, nbytes); return 0; }
int cudaEventCreateWithFlags(void** event, unsigned flags) { *event = (void*)(++next_event); return 0; }
int cudaEventRecord(void* event, void* stream) {
  if (fake_fail_record) return 400;
  note(2, (uintptr_t)event, 0, 0, (uintptr_t)stream);
  return 0;
}
int cudaEventQuery(void* event) { return 0; }
int cudaEventSynchronize(void* event) { return 0; }
int cudaEventDestroy(void* event) { return 0; }
int cudaStreamSynchronize(void* stream) { return 0; }
int cudaDeviceSynchronize(void) { return 0; }
int cudaGetDevice(int* device) { *device = 0; return 0; }
int cudaSetDevice(int device) { return 0; }
int cudaGetDeviceCount(int* count) { *count = 1; return 0; }
int cudaPointerGetAttributes(void* attributes, const void* ptr) { memset(attributes, 0, 88); return 0; }
#if defined(FAKE_BATCH_ABI) && FAKE_BATCH_ABI == 12
int fake_runtime_version = 12080;
#else
int fake_runtime_version = 13000;
#endif
int cudaRuntimeGetVersion(int* version) { *version = fake_runtime_version; return 0; }
int cudaDriverGetVersion(int* version) { *version = 13000; return 0; }
int cudaGetLastError(void) { return 0; }
const char* cudaGetErrorString(int code) { return "fake error"; }

#ifdef FAKE_BATCH_ABI
int fake_batch_calls = 0;
int fake_fail_batch = 0;   /* fail every batch call (nothing copied) */
int fake_batch_mode = 0;   /* 1: a broken batch that reports success and copies nothing */
/* struct cudaMemcpyAttributes: srcAccessOrder, two {type, id} hints, flags */
struct fake_attributes { int order, src_type, src_id, dst_type, dst_id; unsigned flags; };

static int fake_batch(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                      struct fake_attributes* attrs, size_t* attrs_idxs, size_t num_attrs, void* stream) {
  size_t i;
  fake_batch_calls++;
  if (fake_fail_batch) return 700;
  /* what CUDA validates: stream-ordered sources, one attribute for all, not the legacy stream */
  if (count == 0 || num_attrs != 1 || attrs_idxs[0] != 0 || attrs->order != 1 || stream == 0 || stream == (void*)1)
    return 1;
  note(3, count, 0, 0, (uintptr_t)stream);
  for (i = 0; i < count && fake_batch_mode != 1; ++i) {
    memmove(dsts[i], srcs[i], sizes[i]);
    note(1, (uintptr_t)dsts[i], (uintptr_t)srcs[i], sizes[i], (uintptr_t)stream);
  }
  return 0;
}

#if FAKE_BATCH_ABI == 12
int cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                         struct fake_attributes* attrs, size_t* attrs_idxs, size_t num_attrs, size_t* fail_idx,
                         void* stream) {
  int code = fake_batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream);
  if (code) *fail_idx = 0;
  return code;
}
#else
int cudaMemcpyBatchAsync(void* const* dsts, const void* const* srcs, const size_t* sizes, size_t count,
                         struct fake_attributes* attrs, size_t* attrs_idxs, size_t num_attrs, void* stream) {
  return fake_batch(dsts, srcs, sizes, count, attrs, attrs_idxs, num_attrs, stream);
}
#endif
#endif
