// Per-slot stop-flag logic of FastDeploy's `update_inputs_v1` and `update_inputs`, written once and
// compiled twice: into the CUDA kernels (stop_flag_kernels.cu) and into the host implementation
// (stop_flag_host.cc). Keeping one copy is what makes the `cuda` and `host` backends agree bit for
// bit. Pure C++: no Paddle headers, so plain nvcc/g++ build it.
//
// Semantics: docs in fd_async_copy_plugin/reference/update_inputs_semantics.py (the numpy
// statement the tests compare against) and fastdeploy-surface.md sections 5.1/5.2.
#pragma once

#include <stdint.h>

#if defined(__CUDACC__)
#define FDAC_HOST_DEVICE __host__ __device__
#else
#define FDAC_HOST_DEVICE
#endif

namespace fd_async_copy {

// One CUDA block holds one thread per slot; FD's own kernels have the same limit but miscount
// silently beyond it. We refuse instead, on both backends, so they fail the same way.
constexpr int kMaxBatch = 1024;

// Return codes of every extern "C" entry point (stop_flag_api.h).
enum StopFlagStatus : int {
  kStopFlagOk = 0,
  kStopFlagBatchTooLarge = 1,
  kStopFlagBadBatch = 2,
  kStopFlagBadBlockSize = 3,
  kStopFlagNullPointer = 4,
  kStopFlagBadStride = 5,
  kStopFlagCudaError = 6,
};

inline const char* stop_flag_status_message(int status) {
  switch (status) {
    case kStopFlagOk:
      return "ok";
    case kStopFlagBatchTooLarge:
      return "max_bsz (stop_flags.shape[0]) exceeds 1024, the one-block limit of the stop-flag "
             "kernel (and of FastDeploy's update_inputs kernels); lower max_num_seqs";
    case kStopFlagBadBatch:
      return "bsz (seq_lens_this_time.shape[0]) must be in [0, max_bsz]";
    case kStopFlagBadBlockSize:
      return "block_size must be positive";
    case kStopFlagNullPointer:
      return "a required tensor pointer is null";
    case kStopFlagBadStride:
      return "input_ids row stride and block_tables row length must be positive";
    case kStopFlagCudaError:
      return "CUDA kernel launch failed";
    default:
      return "unknown stop-flag status";
  }
}

// Signed overflow is undefined in C++; the GPU wraps. Wrapping explicitly keeps host == device.
FDAC_HOST_DEVICE inline int32_t wrapping_add_i32(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}

// C++ integer division truncates toward zero (the numpy reference reproduces this).
FDAC_HOST_DEVICE inline int64_t block_index_of(int32_t position, int32_t block_size) {
  return static_cast<int64_t>(position / block_size);
}

// ---------------------------------------------------------------------------------------------
// update_inputs_v1 (V1 scheduler)
// ---------------------------------------------------------------------------------------------
struct UpdateInputsV1Slots {
  bool* stop_flags;                 // [max_bsz]
  int32_t* seq_lens_this_time;      // [bsz]
  int32_t* seq_lens_encoder;        // [max_bsz]
  int32_t* seq_lens_decoder;        // [max_bsz]
  int32_t* step_seq_lens_decoder;   // [max_bsz]
  const int64_t* prompt_lens;       // [max_bsz]
  int64_t* topk_ids;                // [bsz] (sampled_token_ids)
  int64_t* input_ids;               // [max_bsz, input_ids_stride]; column 0 is written
  const int32_t* block_tables;      // [rows, block_tables_stride]
  const int64_t* next_tokens;       // [max_bsz]
  bool* is_block_step;              // [max_bsz]
  int64_t input_ids_stride;
  int64_t block_tables_stride;
  int64_t block_tables_numel;
  int32_t block_size;
  bool prefill_one_step_stop;       // PREFILL_NODE_ONE_STEP_STOP_V1 (prefill node of a P/D split)
};

FDAC_HOST_DEVICE inline void clear_lengths(const UpdateInputsV1Slots& s, int i) {
  s.seq_lens_this_time[i] = 0;
  s.seq_lens_decoder[i] = 0;
  s.seq_lens_encoder[i] = 0;
}

// FD reads block_tables at row i, column decoded/block_size, with no bounds check: a column past
// the row reads the next row's entry. We read the same flat element while it lies inside the
// tensor (identical results), and treat a position outside the tensor as "no block" instead of
// reading foreign memory.
FDAC_HOST_DEVICE inline bool has_kv_block(const UpdateInputsV1Slots& s, int i, int32_t decoded) {
  const int64_t flat = static_cast<int64_t>(i) * s.block_tables_stride +
                       block_index_of(decoded, s.block_size);
  if (flat < 0 || flat >= s.block_tables_numel) return false;
  return s.block_tables[flat] != -1;
}

// Updates slot i (< bsz) in place. Returns 1 when the slot no longer takes part in the next
// decode step (it counts towards "every slot stopped"), 0 when it keeps decoding.
FDAC_HOST_DEVICE inline int update_slot(const UpdateInputsV1Slots& s, int i) {
  const int32_t consumed = wrapping_add_i32(s.seq_lens_this_time[i], s.seq_lens_decoder[i]);
  const bool prompt_consumed = static_cast<int64_t>(consumed) >= s.prompt_lens[i];

  if (s.stop_flags[i]) {
    // Stopped while still in prefill (e.g. max_tokens=1 with chunked prefill): the token sampled
    // from a partial prompt must not be emitted.
    if (!prompt_consumed) s.topk_ids[i] = -1;
    clear_lengths(s, i);
    return 1;
  }
  if (!prompt_consumed) {
    // A non-final chunk of chunked prefill: park the slot; the scheduler inserts the next chunk.
    s.stop_flags[i] = true;
    clear_lengths(s, i);
    s.topk_ids[i] = -1;
    return 1;
  }
  if (s.prefill_one_step_stop) {
    // A prefill-only node hands the request to the decode node after its prefill.
    s.stop_flags[i] = true;
    clear_lengths(s, i);
    return 1;
  }

  // Decode step: the tokens of this step join the KV cache, the sampled token is the next input.
  s.seq_lens_decoder[i] = consumed;
  s.seq_lens_this_time[i] = 1;
  s.seq_lens_encoder[i] = 0;
  s.input_ids[static_cast<int64_t>(i) * s.input_ids_stride] = s.next_tokens[i];

  if (!has_kv_block(s, i, consumed)) {
    // No KV block for the next position: hand the slot to the scheduler (block step).
    s.is_block_step[i] = true;
    s.seq_lens_this_time[i] = 0;
    s.stop_flags[i] = true;
    s.step_seq_lens_decoder[i] = consumed;
    s.seq_lens_decoder[i] = 0;
    return 1;
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// update_inputs (non-V1 scheduler)
// ---------------------------------------------------------------------------------------------
struct UpdateInputsSlots {
  const bool* stop_flags;           // [max_bsz]
  int32_t* seq_lens_this_time;      // [bsz]
  int32_t* seq_lens_encoder;        // [max_bsz]
  int32_t* seq_lens_decoder;        // [max_bsz]
  int64_t* input_ids;               // [max_bsz, input_ids_stride]; column 0 is written
  const int64_t* next_tokens;       // [bsz] (sampled_token_ids)
  const bool* is_block_step;        // [max_bsz]
  int64_t input_ids_stride;
};

FDAC_HOST_DEVICE inline int update_slot(const UpdateInputsSlots& s, int i) {
  const bool stopped = s.stop_flags[i];
  const int32_t encoder = s.seq_lens_encoder[i];
  const int32_t decoder = s.seq_lens_decoder[i];
  // After a prefill the whole prompt is in the KV cache; after a decode step, one more token.
  s.seq_lens_decoder[i] =
      stopped ? 0 : (encoder > 0 ? wrapping_add_i32(encoder, decoder) : wrapping_add_i32(decoder, 1));
  s.seq_lens_this_time[i] = stopped ? 0 : 1;
  s.seq_lens_encoder[i] = 0;
  s.input_ids[static_cast<int64_t>(i) * s.input_ids_stride] = s.next_tokens[i];
  // A block-step slot waits for KV blocks and will resume: it keeps the batch alive.
  return (stopped && !s.is_block_step[i]) ? 1 : 0;
}

// ---------------------------------------------------------------------------------------------
// The batch-level result, shared by both backends
// ---------------------------------------------------------------------------------------------

// Slots in [bsz, max_bsz) are empty and count as stopped. FD 2.4 compares with stop_nums[0]
// (== max_num_seqs == max_bsz); FD 2.5+ compares with max_bsz. A null stop_nums means the latter.
FDAC_HOST_DEVICE inline bool not_need_stop_from(int64_t stopped_slots, const int64_t* stop_nums,
                                                int max_bsz) {
  const int64_t threshold = stop_nums ? stop_nums[0] : static_cast<int64_t>(max_bsz);
  return stopped_slots < threshold;
}

// Host-side argument checks, run before any slot is touched (host and CUDA launchers alike).
inline int check_batch(int bsz, int max_bsz) {
  if (max_bsz > kMaxBatch) return kStopFlagBatchTooLarge;
  if (max_bsz < 0 || bsz < 0 || bsz > max_bsz) return kStopFlagBadBatch;
  return kStopFlagOk;
}

inline int check_v1_args(const UpdateInputsV1Slots& s, bool* not_need_stop, int bsz, int max_bsz) {
  const int batch = check_batch(bsz, max_bsz);
  if (batch != kStopFlagOk) return batch;
  if (s.block_size <= 0) return kStopFlagBadBlockSize;
  if (s.input_ids_stride <= 0 || s.block_tables_stride <= 0) return kStopFlagBadStride;
  if (!not_need_stop) return kStopFlagNullPointer;
  // block_tables may be null when empty: has_kv_block bounds-checks before reading.
  if (bsz > 0 && (!s.stop_flags || !s.seq_lens_this_time || !s.seq_lens_encoder ||
                  !s.seq_lens_decoder || !s.step_seq_lens_decoder || !s.prompt_lens ||
                  !s.topk_ids || !s.input_ids || !s.next_tokens || !s.is_block_step)) {
    return kStopFlagNullPointer;
  }
  return kStopFlagOk;
}

inline int check_args(const UpdateInputsSlots& s, bool* not_need_stop, int bsz, int max_bsz) {
  const int batch = check_batch(bsz, max_bsz);
  if (batch != kStopFlagOk) return batch;
  if (s.input_ids_stride <= 0) return kStopFlagBadStride;
  if (!not_need_stop) return kStopFlagNullPointer;
  if (bsz > 0 && (!s.stop_flags || !s.seq_lens_this_time || !s.seq_lens_encoder ||
                  !s.seq_lens_decoder || !s.input_ids || !s.next_tokens || !s.is_block_step)) {
    return kStopFlagNullPointer;
  }
  return kStopFlagOk;
}

}  // namespace fd_async_copy
