// C entry points of the stop-flag ops, callable from ctypes/CuPy/PyTorch without Paddle headers.
//
//   libfd_async_copy_cuda.so  (stop_flag_kernels.cu, nvcc): the *_cuda launchers; every pointer is a
//                             device pointer, `not_need_stop` included (a DEVICE flag, as in FD 2.5
//                             after PR #6176). Nothing is copied to the host; the caller records an
//                             event and copies the flag into pinned memory when it wants it.
//   stop_flag_host.cc (g++, also linked into the Paddle pybind module): the *_host versions; every
//                             pointer is host-accessible (CPU or pinned).
//
// Arguments follow FastDeploy's Python signatures (fastdeploy-surface.md 5.1/5.2), then the
// shapes the kernel needs:
//   bsz        = seq_lens_this_time.shape[0]   (running slots)
//   max_bsz    = stop_flags.shape[0]           (must be <= 1024)
//   stop_nums  may be NULL: compare with max_bsz (FD 2.5+); else with stop_nums[0] (FD 2.4).
// Every function returns a StopFlagStatus (0 = ok, see stop_flag_slot.h); on a non-zero status
// nothing has been modified (argument errors) or the launch failed (kStopFlagCudaError).
#pragma once

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int fdac_update_inputs_v1_host(bool* stop_flags, bool* not_need_stop, int32_t* seq_lens_this_time,
                               int32_t* seq_lens_encoder, int32_t* seq_lens_decoder,
                               int32_t* step_seq_lens_decoder, const int64_t* prompt_lens,
                               int64_t* topk_ids, int64_t* input_ids, const int32_t* block_tables,
                               const int64_t* stop_nums, const int64_t* next_tokens,
                               bool* is_block_step, int bsz, int max_bsz, int64_t input_ids_stride,
                               int64_t block_tables_stride, int64_t block_tables_numel,
                               int block_size, int prefill_one_step_stop);

int fdac_update_inputs_host(const bool* stop_flags, bool* not_need_stop,
                            int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                            int32_t* seq_lens_decoder, int64_t* input_ids,
                            const int64_t* stop_nums, const int64_t* next_tokens,
                            const bool* is_block_step, int bsz, int max_bsz,
                            int64_t input_ids_stride);

const char* fdac_host_status_message(int status);

// `stream` is a cudaStream_t (NULL = the legacy default stream).
int fdac_update_inputs_v1_cuda(bool* stop_flags, bool* not_need_stop, int32_t* seq_lens_this_time,
                               int32_t* seq_lens_encoder, int32_t* seq_lens_decoder,
                               int32_t* step_seq_lens_decoder, const int64_t* prompt_lens,
                               int64_t* topk_ids, int64_t* input_ids, const int32_t* block_tables,
                               const int64_t* stop_nums, const int64_t* next_tokens,
                               bool* is_block_step, int bsz, int max_bsz, int64_t input_ids_stride,
                               int64_t block_tables_stride, int64_t block_tables_numel,
                               int block_size, int prefill_one_step_stop, void* stream);

int fdac_update_inputs_cuda(const bool* stop_flags, bool* not_need_stop,
                            int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                            int32_t* seq_lens_decoder, int64_t* input_ids,
                            const int64_t* stop_nums, const int64_t* next_tokens,
                            const bool* is_block_step, int bsz, int max_bsz,
                            int64_t input_ids_stride, void* stream);

// The message for a status; for kStopFlagCudaError, the CUDA error of this thread's last launch.
const char* fdac_cuda_status_message(int status);

// Largest max_bsz the kernels accept (1024).
int fdac_cuda_max_batch(void);

#ifdef __cplusplus
}
#endif
