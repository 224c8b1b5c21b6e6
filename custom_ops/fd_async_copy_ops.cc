// The Paddle pybind module `fd_async_copy_ops`: host-pointer access to the stop flag and the host
// implementation of the stop-flag ops, for Paddle tensors.
//
// Why pybind functions and not PD_BUILD_OP: a Paddle op that receives a pinned tensor first copies
// it to the GPU (blocking) and re-points the tensor there (PHI data transform). Functions taking
// `paddle::Tensor&` touch the host pointer directly, so they are safe on pinned memory - the same
// reason FD 2.5 exposes get_stop/set_stop this way.
#include <algorithm>
#include <vector>

#include "paddle/extension.h"
#include "pybind11/pybind11.h"
#include "stop_flag_api.h"

namespace {

// Host-accessible: CPU or pinned. A GPU pointer dereferenced on the host would crash the server.
void check_host_tensor(const paddle::Tensor& t, const char* name, paddle::DataType dtype,
                       int64_t min_numel) {
  PD_CHECK(t.dtype() == dtype, name, " has dtype ", t.dtype(), ", expected ", dtype);
  if (min_numel == 0 && t.numel() == 0) return;  // never dereferenced (e.g. bsz == 0)
  PD_CHECK(t.initialized(), name, " is not initialized");
  PD_CHECK(t.is_cpu() || t.is_gpu_pinned(), name,
           " must be a CPU or pinned tensor (its host pointer is read and written directly)");
  PD_CHECK(t.is_contiguous(), name, " must be contiguous");
  PD_CHECK(t.numel() >= min_numel, name, " has ", t.numel(), " elements, needs at least ",
           min_numel);
}

// Null for an empty tensor: the C implementation touches no slot when bsz == 0.
template <class T>
T* host_data(const paddle::Tensor& t) {
  return t.numel() == 0 ? nullptr : const_cast<T*>(t.data<T>());
}

int64_t rows(const paddle::Tensor& t) { return t.shape().empty() ? 1 : t.shape()[0]; }
int64_t row_stride(const paddle::Tensor& t) {
  return t.shape().size() < 2 ? 1 : t.numel() / std::max<int64_t>(rows(t), 1);
}

void raise_on_status(int status) {
  PD_CHECK(status == 0, "fd_async_copy stop-flag op: ", fdac_host_status_message(status));
}

paddle::Tensor GetStop(paddle::Tensor& flag) {
  check_host_tensor(flag, "not_need_stop", paddle::DataType::BOOL, 1);
  auto out = paddle::empty({1}, paddle::DataType::BOOL, paddle::CPUPlace());
  host_data<bool>(out)[0] = host_data<bool>(flag)[0];
  return out;
}

void SetStop(paddle::Tensor& flag, bool value) {
  check_host_tensor(flag, "not_need_stop", paddle::DataType::BOOL, 1);
  host_data<bool>(flag)[0] = value;
}

// The checks both update ops run, split where the v1 op checks its extra tensors in between (the
// order decides which message a call with several bad tensors gets).
struct Batch {
  int64_t bsz;
  int64_t max_bsz;
};

Batch check_batch(const paddle::Tensor& stop_flags, const paddle::Tensor& not_need_stop,
                  const paddle::Tensor& seq_lens_this_time,
                  const paddle::Tensor& seq_lens_encoder,
                  const paddle::Tensor& seq_lens_decoder) {
  const int64_t max_bsz = rows(stop_flags);
  const int64_t bsz = rows(seq_lens_this_time);
  PD_CHECK(max_bsz <= 1024, "fd_async_copy stop-flag op: ",
           fdac_host_status_message(1));  // before any size arithmetic below
  PD_CHECK(bsz <= max_bsz, "fd_async_copy stop-flag op: ", fdac_host_status_message(2));
  check_host_tensor(not_need_stop, "not_need_stop", paddle::DataType::BOOL, 1);
  check_host_tensor(stop_flags, "stop_flags", paddle::DataType::BOOL, max_bsz);
  check_host_tensor(seq_lens_this_time, "seq_lens_this_time", paddle::DataType::INT32, bsz);
  check_host_tensor(seq_lens_encoder, "seq_lens_encoder", paddle::DataType::INT32, bsz);
  check_host_tensor(seq_lens_decoder, "seq_lens_decoder", paddle::DataType::INT32, bsz);
  return {bsz, max_bsz};
}

// Checks the step outputs and input_ids (the kernels read input_ids[i * stride], i < bsz);
// returns input_ids' row stride.
int64_t check_step_tensors(const paddle::Tensor& next_tokens, const paddle::Tensor& is_block_step,
                           const paddle::Tensor& input_ids, int64_t bsz) {
  check_host_tensor(next_tokens, "next_tokens", paddle::DataType::INT64, bsz);
  check_host_tensor(is_block_step, "is_block_step", paddle::DataType::BOOL, bsz);
  const int64_t ids_stride = row_stride(input_ids);
  check_host_tensor(input_ids, "input_ids", paddle::DataType::INT64,
                    bsz == 0 ? 0 : (bsz - 1) * ids_stride + 1);
  return ids_stride;
}

// Null when absent: the C implementation then compares with max_bsz.
const int64_t* checked_stop_nums(const paddle::optional<paddle::Tensor>& stop_nums) {
  if (!stop_nums) return nullptr;
  check_host_tensor(*stop_nums, "stop_nums", paddle::DataType::INT64, 1);
  return host_data<int64_t>(*stop_nums);
}

// FD's positional order (fastdeploy-surface.md 5.1), with `stop_nums` optional (None: compare with
// max_bsz, as FD 2.5+) and the one-step-stop switch explicit (the Python wrapper reads the env).
void UpdateInputsV1Host(paddle::Tensor& stop_flags, paddle::Tensor& not_need_stop,
                        paddle::Tensor& seq_lens_this_time, paddle::Tensor& seq_lens_encoder,
                        paddle::Tensor& seq_lens_decoder, paddle::Tensor& step_seq_lens_decoder,
                        paddle::Tensor& prompt_lens, paddle::Tensor& topk_ids,
                        paddle::Tensor& input_ids, paddle::Tensor& block_tables,
                        paddle::optional<paddle::Tensor>& stop_nums, paddle::Tensor& next_tokens,
                        paddle::Tensor& is_block_step, int block_size, bool prefill_one_step_stop) {
  const Batch b = check_batch(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder,
                              seq_lens_decoder);
  check_host_tensor(step_seq_lens_decoder, "step_seq_lens_decoder", paddle::DataType::INT32, b.bsz);
  check_host_tensor(prompt_lens, "prompt_lens", paddle::DataType::INT64, b.bsz);
  check_host_tensor(topk_ids, "topk_ids", paddle::DataType::INT64, b.bsz);
  const int64_t ids_stride = check_step_tensors(next_tokens, is_block_step, input_ids, b.bsz);
  check_host_tensor(block_tables, "block_tables", paddle::DataType::INT32, 0);
  const int64_t* stop_nums_data = checked_stop_nums(stop_nums);
  raise_on_status(fdac_update_inputs_v1_host(
      host_data<bool>(stop_flags), host_data<bool>(not_need_stop),
      host_data<int32_t>(seq_lens_this_time), host_data<int32_t>(seq_lens_encoder),
      host_data<int32_t>(seq_lens_decoder), host_data<int32_t>(step_seq_lens_decoder),
      host_data<int64_t>(prompt_lens), host_data<int64_t>(topk_ids), host_data<int64_t>(input_ids),
      host_data<int32_t>(block_tables), stop_nums_data, host_data<int64_t>(next_tokens),
      host_data<bool>(is_block_step), static_cast<int>(b.bsz), static_cast<int>(b.max_bsz),
      ids_stride, row_stride(block_tables), block_tables.numel(), block_size,
      prefill_one_step_stop ? 1 : 0));
}

void UpdateInputsHost(paddle::Tensor& stop_flags, paddle::Tensor& not_need_stop,
                      paddle::Tensor& seq_lens_this_time, paddle::Tensor& seq_lens_encoder,
                      paddle::Tensor& seq_lens_decoder, paddle::Tensor& input_ids,
                      paddle::optional<paddle::Tensor>& stop_nums, paddle::Tensor& next_tokens,
                      paddle::Tensor& is_block_step) {
  const Batch b = check_batch(stop_flags, not_need_stop, seq_lens_this_time, seq_lens_encoder,
                              seq_lens_decoder);
  const int64_t ids_stride = check_step_tensors(next_tokens, is_block_step, input_ids, b.bsz);
  const int64_t* stop_nums_data = checked_stop_nums(stop_nums);
  raise_on_status(fdac_update_inputs_host(
      host_data<bool>(stop_flags), host_data<bool>(not_need_stop),
      host_data<int32_t>(seq_lens_this_time), host_data<int32_t>(seq_lens_encoder),
      host_data<int32_t>(seq_lens_decoder), host_data<int64_t>(input_ids), stop_nums_data,
      host_data<int64_t>(next_tokens), host_data<bool>(is_block_step), static_cast<int>(b.bsz),
      static_cast<int>(b.max_bsz), ids_stride));
}

}  // namespace

PYBIND11_MODULE(fd_async_copy_ops, m) {
  namespace py = pybind11;
  m.doc() = "fd-async-copy-plugin custom ops: host stop flag access and host stop-flag ops";
  m.def("get_stop", &GetStop, py::arg("not_need_stop"),
        "Read a CPU/pinned bool flag through its host pointer; returns a new CPU bool tensor [1].");
  m.def("set_stop", &SetStop, py::arg("not_need_stop"), py::arg("flag"),
        "Write a CPU/pinned bool flag through its host pointer.");
  m.def("update_inputs_v1_host", &UpdateInputsV1Host, py::arg("stop_flags"),
        py::arg("not_need_stop"), py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"),
        py::arg("seq_lens_decoder"), py::arg("step_seq_lens_decoder"), py::arg("prompt_lens"),
        py::arg("topk_ids"), py::arg("input_ids"), py::arg("block_tables"), py::arg("stop_nums"),
        py::arg("next_tokens"), py::arg("is_block_step"), py::arg("block_size"),
        py::arg("prefill_one_step_stop"),
        "FD update_inputs_v1 semantics on host tensors; writes not_need_stop[0].");
  m.def("update_inputs_host", &UpdateInputsHost, py::arg("stop_flags"), py::arg("not_need_stop"),
        py::arg("seq_lens_this_time"), py::arg("seq_lens_encoder"), py::arg("seq_lens_decoder"),
        py::arg("input_ids"), py::arg("stop_nums"), py::arg("next_tokens"),
        py::arg("is_block_step"),
        "FD update_inputs semantics on host tensors; writes not_need_stop[0].");
}
