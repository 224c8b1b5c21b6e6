// One decode step's device-to-host copies and their event record in one call (issue 24).
//
// From Python each CUDA runtime call through ctypes costs its own argument conversion and GIL
// round trip; a step issues three copies and a record. This makes them one ctypes call.
// It includes no CUDA header and links no CUDA runtime: it calls the functions it is given, i.e.
// the process's own cudaMemcpyAsync, cudaEventRecord and (CUDA 12.8 and later) cudaMemcpyBatchAsync
// (the libcudart Paddle loaded, as the Python layer in runtime/cudart.py does), so the same
// context, device and error state apply. Built into the custom-ops module (the plugin loads it from
// there with ctypes); the CPU tests compile it alone and run it over a C stand-in for libcudart.
#include <cstddef>

extern "C" {

typedef int (*fdac_memcpy_async_fn)(void* dst, const void* src, size_t nbytes, int kind, void* stream);
typedef int (*fdac_event_record_fn)(void* event, void* stream);
// cudaMemcpyBatchAsync: CUDA 13's, and CUDA 12.8-12.9's (a failIdx before the stream).
typedef int (*fdac_memcpy_batch13_fn)(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                      size_t count, void* attrs, size_t* attrs_idxs, size_t num_attrs,
                                      void* stream);
typedef int (*fdac_memcpy_batch12_fn)(void* const* dsts, const void* const* srcs, const size_t* sizes,
                                      size_t count, void* attrs, size_t* attrs_idxs, size_t num_attrs,
                                      size_t* fail_idx, void* stream);

// The CUDA runtime functions a batch calls. memcpy_batch is null unless the runtime has
// cudaMemcpyBatchAsync and the plugin's check of it passed (runtime/probe.py); batch_abi is then 13
// or 12 (which signature: the runtime's major version).
struct fdac_cuda_api {
  void* memcpy_async;
  void* event_record;
  void* memcpy_batch;
  int batch_abi;
};

// struct cudaMemcpyAttributes (driver_types.h, CUDA 12.8-13): every member four bytes.
struct fdac_memcpy_attributes {
  int src_access_order;  // cudaMemcpySrcAccessOrderStream: read the sources in stream order
  int src_hint_type, src_hint_id, dst_hint_type, dst_hint_id;  // hints for managed memory: none
  unsigned flags;
};

enum { kMaxCopies = 16, kDeviceToHost = 2, kSrcAccessOrderStream = 1 };

// The index written to *failed when cudaMemcpyBatchAsync fails (count: the record; 0..count-1: a
// copy of the one-by-one loop).
static int batch_call_index(int count) { return count + 1; }

// The one call that issues a copy set's device-to-host copies (runtime/cuda.py's _issue): first
// checks every copy against its destination's capacity (nbytes[i] <= capacity[i]; none issued
// otherwise: returns -2 with *failed the first copy that does not fit), then issues the copies
// (dst[i] <- src[i], nbytes[i] bytes, device to host, a zero-byte copy skipped) on stream, then
// records the set's own event there unless it is null. Two or more copies go as one
// cudaMemcpyBatchAsync where the api has it and the stream is a created one (the batch call refuses
// the legacy default stream); else one cudaMemcpyAsync each, in order. Returns 0, or the first
// failing call's error code with *failed set to its index. Nothing after a failing call is issued.
int fdac_d2h_batch(const fdac_cuda_api* api, int count, void* const* dst, const void* const* src,
                   const size_t* nbytes, const size_t* capacity, void* stream, void* event, int* failed) {
  for (int i = 0; i < count; ++i) {
    if (nbytes[i] > capacity[i]) {
      *failed = i;
      return -2;
    }
  }
  // Only where the batch call may be used: its arrays hold the non-empty copies (compacted here).
  const bool legacy_stream = stream == nullptr || stream == reinterpret_cast<void*>(1);
  bool batched = false;
  if (api->memcpy_batch != nullptr && count <= kMaxCopies && !legacy_stream) {
    void* dsts[kMaxCopies];
    const void* srcs[kMaxCopies];
    size_t sizes[kMaxCopies];
    size_t copies = 0;
    for (int i = 0; i < count; ++i) {
      if (nbytes[i] == 0) continue;
      dsts[copies] = dst[i];
      srcs[copies] = src[i];
      sizes[copies++] = nbytes[i];
    }
    if (copies >= 2) {
      fdac_memcpy_attributes attrs = {kSrcAccessOrderStream, 0, 0, 0, 0, 0u};
      size_t first = 0, fail_idx = 0;
      int code = api->batch_abi == 12
          ? reinterpret_cast<fdac_memcpy_batch12_fn>(api->memcpy_batch)(dsts, srcs, sizes, copies, &attrs, &first,
                                                                        1, &fail_idx, stream)
          : reinterpret_cast<fdac_memcpy_batch13_fn>(api->memcpy_batch)(dsts, srcs, sizes, copies, &attrs, &first,
                                                                        1, stream);
      if (code != 0) {
        *failed = batch_call_index(count);
        return code;
      }
      batched = true;
    }
  }
  if (!batched) {
    fdac_memcpy_async_fn copy = reinterpret_cast<fdac_memcpy_async_fn>(api->memcpy_async);
    for (int i = 0; i < count; ++i) {
      if (nbytes[i] == 0) continue;
      int code = copy(dst[i], src[i], nbytes[i], kDeviceToHost, stream);
      if (code != 0) {
        *failed = i;
        return code;
      }
    }
  }
  if (event != nullptr) {
    int code = reinterpret_cast<fdac_event_record_fn>(api->event_record)(event, stream);
    if (code != 0) {
      *failed = count;
      return code;
    }
  }
  *failed = -1;
  return 0;
}

// A copy set described once (runtime/cuda.py's _CopySet: a ring slot's buffers, a decode step's
// outputs): its destinations and their capacities fixed, its sources and sizes rewritten by the
// caller before each call. Each call passes only this, the stream and the set's event: the Python
// side converts three arguments instead of nine. Same checks, calls and result as fdac_d2h_batch;
// the index of a failing call lands in failed.
struct fdac_d2h_set {
  const fdac_cuda_api* api;
  int count;
  void* const* dst;
  const void* const* src;
  const size_t* nbytes;
  const size_t* capacity;
  int failed;
};

int fdac_d2h_set_issue(fdac_d2h_set* set, void* stream, void* event) {
  return fdac_d2h_batch(set->api, set->count, set->dst, set->src, set->nbytes, set->capacity, stream, event,
                        &set->failed);
}

}  // extern "C"
