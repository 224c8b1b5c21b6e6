/* A stand-in for libcudart with the calls runtime/cudart.py binds, for CPU tests of the ctypes
 * layer and of fdac_d2h_batch: host memory, memmove copies, events that are counters. Every copy
 * and record is logged (fake_log), and a call can be made to fail (fake_fail_*). Written for this
 * project's tests; not NVIDIA code. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FAKE_LOG 256
/* kind 1: copy (dst, src, nbytes, stream), kind 2: record (event, stream) */
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
int cudaRuntimeGetVersion(int* version) { *version = 13000; return 0; }
int cudaDriverGetVersion(int* version) { *version = 13000; return 0; }
int cudaGetLastError(void) { return 0; }
const char* cudaGetErrorString(int code) { return "fake error"; }
