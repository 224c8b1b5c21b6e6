// Host implementation of the stop-flag ops over the shared per-slot logic (stop_flag_slot.h).
// Used by the `host` copy backend on CPU tensors (through the Paddle pybind module) and by the
// GPU kernel check as the ground truth the kernels must match bit for bit.
#include "stop_flag_api.h"
#include "stop_flag_slot.h"

namespace fd_async_copy {
namespace {

// Same counting as the kernel: slots < bsz report themselves, [bsz, max_bsz) count as stopped.
template <class Slots>
bool run_slots(const Slots& slots, int bsz, int max_bsz, const int64_t* stop_nums) {
  int64_t stopped = max_bsz - bsz;
  for (int i = 0; i < bsz; ++i) stopped += update_slot(slots, i);
  return not_need_stop_from(stopped, stop_nums, max_bsz);
}

}  // namespace
}  // namespace fd_async_copy

using namespace fd_async_copy;

extern "C" int fdac_update_inputs_v1_host(
    bool* stop_flags, bool* not_need_stop, int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
    int32_t* seq_lens_decoder, int32_t* step_seq_lens_decoder, const int64_t* prompt_lens,
    int64_t* topk_ids, int64_t* input_ids, const int32_t* block_tables, const int64_t* stop_nums,
    const int64_t* next_tokens, bool* is_block_step, int bsz, int max_bsz,
    int64_t input_ids_stride, int64_t block_tables_stride, int64_t block_tables_numel,
    int block_size, int prefill_one_step_stop) {
  const UpdateInputsV1Slots slots{stop_flags,       seq_lens_this_time, seq_lens_encoder,
                                  seq_lens_decoder, step_seq_lens_decoder, prompt_lens,
                                  topk_ids,         input_ids,          block_tables,
                                  next_tokens,      is_block_step,      input_ids_stride,
                                  block_tables_stride, block_tables_numel, block_size,
                                  prefill_one_step_stop != 0};
  const int status = check_v1_args(slots, not_need_stop, bsz, max_bsz);
  if (status != kStopFlagOk) return status;
  *not_need_stop = run_slots(slots, bsz, max_bsz, stop_nums);
  return kStopFlagOk;
}

extern "C" int fdac_update_inputs_host(const bool* stop_flags, bool* not_need_stop,
                                       int32_t* seq_lens_this_time, int32_t* seq_lens_encoder,
                                       int32_t* seq_lens_decoder, int64_t* input_ids,
                                       const int64_t* stop_nums, const int64_t* next_tokens,
                                       const bool* is_block_step, int bsz, int max_bsz,
                                       int64_t input_ids_stride) {
  const UpdateInputsSlots slots{stop_flags, seq_lens_this_time, seq_lens_encoder,
                                seq_lens_decoder, input_ids, next_tokens, is_block_step,
                                input_ids_stride};
  const int status = check_args(slots, not_need_stop, bsz, max_bsz);
  if (status != kStopFlagOk) return status;
  *not_need_stop = run_slots(slots, bsz, max_bsz, stop_nums);
  return kStopFlagOk;
}

extern "C" const char* fdac_host_status_message(int status) {
  return stop_flag_status_message(status);
}
