// CUDA kernels of the stop-flag ops over the shared per-slot logic (stop_flag_slot.h).
//
// Why our own kernels: FD 2.4's update_inputs/update_inputs_v1 copy the flag to pageable host
// memory inside the op (a hidden sync) and cannot take a device or pinned flag (PR #6176 changed
// that in 2.5). These kernels write `not_need_stop` on the DEVICE and copy nothing; the caller
// copies the flag to pinned memory behind an event. Plain CUDA, no Paddle headers: the launchers
// take raw pointers and a cudaStream_t, so any framework (Paddle via ctypes, CuPy, PyTorch) can
// drive them.
#include <cuda_runtime.h>

#include "stop_flag_api.h"
#include "stop_flag_slot.h"

namespace fd_async_copy {
namespace {

// One block, one thread per slot. Every slot's count is 0 or 1, so __syncthreads_count is the
// whole block reduction; thread 0 writes the device flag.
template <class Slots>
__global__ void stop_flag_kernel(Slots slots, int bsz, int max_bsz, const int64_t* stop_nums,
                                 bool* not_need_stop) {
  const int i = static_cast<int>(threadIdx.x);
  int stopped = 0;
  if (i < bsz) {
    stopped = update_slot(slots, i);
  } else if (i < max_bsz) {
    stopped = 1;  // an empty slot
  }
  const int stopped_slots = __syncthreads_count(stopped);
  if (i == 0) *not_need_stop = not_need_stop_from(stopped_slots, stop_nums, max_bsz);
}

thread_local cudaError_t last_launch_error = cudaSuccess;

template <class Slots>
int launch(const Slots& slots, int bsz, int max_bsz, const int64_t* stop_nums,
           bool* not_need_stop, void* stream) {
  // Whole warps, at least one (max_bsz == 0 still writes the flag).
  const int threads = max_bsz <= 0 ? 32 : ((max_bsz + 31) / 32) * 32;
  stop_flag_kernel<<<1, threads, 0, static_cast<cudaStream_t>(stream)>>>(slots, bsz, max_bsz,
                                                                        stop_nums, not_need_stop);
  last_launch_error = cudaGetLastError();
  return last_launch_error == cudaSuccess ? kStopFlagOk : kStopFlagCudaError;
}

}  // namespace
}  // namespace fd_async_copy

using namespace fd_async_copy;

extern "C" int fdac_update_inputs_v1_cuda(
    bool* stop_flags, bool* not_need_stop, int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
    int32_t* seq_lens_decoder, int32_t* step_seq_lens_decoder, const int64_t* prompt_lens,
    int64_t* topk_ids, int64_t* input_ids, const int32_t* block_tables, const int64_t* stop_nums,
    const int64_t* next_tokens, bool* is_block_step, int bsz, int max_bsz,
    int64_t input_ids_stride, int64_t block_tables_stride, int64_t block_tables_numel,
    int block_size, int prefill_one_step_stop, void* stream) {
  const UpdateInputsV1Slots slots{stop_flags,       seq_lens_this_time, seq_lens_encoder,
                                  seq_lens_decoder, step_seq_lens_decoder, prompt_lens,
                                  topk_ids,         input_ids,          block_tables,
                                  next_tokens,      is_block_step,      input_ids_stride,
                                  block_tables_stride, block_tables_numel, block_size,
                                  prefill_one_step_stop != 0};
  const int status = check_v1_args(slots, not_need_stop, bsz, max_bsz);
  if (status != kStopFlagOk) return status;
  return launch(slots, bsz, max_bsz, stop_nums, not_need_stop, stream);
}

extern "C" int fdac_update_inputs_cuda(const bool* stop_flags, bool* not_need_stop,
                                       int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                                       int32_t* seq_lens_decoder, int64_t* input_ids,
                                       const int64_t* stop_nums, const int64_t* next_tokens,
                                       const bool* is_block_step, int bsz, int max_bsz,
                                       int64_t input_ids_stride, void* stream) {
  const UpdateInputsSlots slots{stop_flags, seq_lens_this_time, seq_lens_encoder,
                                seq_lens_decoder, input_ids, next_tokens, is_block_step,
                                input_ids_stride};
  const int status = check_args(slots, not_need_stop, bsz, max_bsz);
  if (status != kStopFlagOk) return status;
  return launch(slots, bsz, max_bsz, stop_nums, not_need_stop, stream);
}

extern "C" const char* fdac_cuda_status_message(int status) {
  if (status == kStopFlagCudaError) return cudaGetErrorString(last_launch_error);
  return stop_flag_status_message(status);
}

extern "C" int fdac_cuda_max_batch(void) { return kMaxBatch; }
