// One decode step's device-to-host copies and their event record in one call (issue 24).
//
// From Python each CUDA runtime call through ctypes costs its own argument conversion and GIL
// round trip; a step issues three copies and a record. This loop makes them one ctypes call.
// It includes no CUDA header and links no CUDA runtime: it calls the functions it is given, i.e.
// the process's own cudaMemcpyAsync and cudaEventRecord (the libcudart Paddle loaded, as the
// Python layer in runtime/cudart.py does), so the same context, device and error state apply.
// Built into the custom-ops module (the plugin loads it from there with ctypes); the CPU tests
// compile it alone and pass it recording callbacks.
#include <cstddef>

extern "C" {

typedef int (*fdac_memcpy_async_fn)(void* dst, const void* src, size_t nbytes, int kind, void* stream);
typedef int (*fdac_event_record_fn)(void* event, void* stream);

// Issues cudaMemcpyAsync(dst[i], src[i], nbytes[i], cudaMemcpyDeviceToHost, stream) for each i in
// order (a zero-byte copy is skipped), then cudaEventRecord(event, stream) unless event is null.
// Returns 0, or the first failing call's error code with *failed set to its index (count: the
// record). Nothing after a failing call is issued.
int fdac_d2h_batch(void* memcpy_async, void* event_record, int count, void* const* dst,
                   const void* const* src, const size_t* nbytes, void* stream, void* event,
                   int* failed) {
  const int kDeviceToHost = 2;  // cudaMemcpyDeviceToHost (driver_types.h)
  fdac_memcpy_async_fn copy = reinterpret_cast<fdac_memcpy_async_fn>(memcpy_async);
  for (int i = 0; i < count; ++i) {
    if (nbytes[i] == 0) continue;
    int code = copy(dst[i], src[i], nbytes[i], kDeviceToHost, stream);
    if (code != 0) {
      *failed = i;
      return code;
    }
  }
  if (event != nullptr) {
    int code = reinterpret_cast<fdac_event_record_fn>(event_record)(event, stream);
    if (code != 0) {
      *failed = count;
      return code;
    }
  }
  *failed = -1;
  return 0;
}

// A batch whose destinations and sizes stay the same from call to call (a ring slot's buffers),
// prepared once by the caller: each call passes only this, the stream and the event, so the
// Python side converts three arguments instead of nine. Same calls and result as fdac_d2h_batch;
// the index of a failing call lands in failed.
struct fdac_d2h_prepared {
  void* memcpy_async;
  void* event_record;
  int count;
  void* const* dst;
  const void* const* src;
  const size_t* nbytes;
  int failed;
};

int fdac_d2h_batch_prepared(fdac_d2h_prepared* batch, void* stream, void* event) {
  return fdac_d2h_batch(batch->memcpy_async, batch->event_record, batch->count, batch->dst, batch->src,
                        batch->nbytes, stream, event, &batch->failed);
}

}  // extern "C"
