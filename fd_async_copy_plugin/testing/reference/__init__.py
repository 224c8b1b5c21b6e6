"""A replica of FastDeploy's surface at the plugin's patch points, plus a deterministic decode driver.

Written from ``docs``/``fastdeploy-surface.md`` and checked against the FastDeploy 2.4 and 2.5
sources by reading them; no FastDeploy code is copied. Two replica roots mirror FastDeploy's module
paths relative to ``fastdeploy`` so that the plugin's patches, written against a configurable root
module, apply to them unchanged:

- ``fd_async_copy_plugin.testing.reference.fd24`` - FastDeploy 2.4 (branch ``r3_fix_int32_bug_2.4``):
  blocking ``.cpu()`` logprob copies, a 13-tensor ``update_inputs_v1`` that blocks on the
  host ``not_need_stop``, saving inside ``post_process``.
- ``fd_async_copy_plugin.testing.reference.fd25`` - FastDeploy 2.5 after #6176/#6259/#6362: pinned
  ``not_need_stop``/``sampled_token_ids``, an event per step, ``_save_model_output``, per-step
  pinned logprob buffers.
- ``fd_async_copy_plugin.testing.reference.fddev`` - FastDeploy develop (2.6-dev), a delta over
  ``fd25``: no ``not_need_stop()`` (#6356), the device ``infer_seed`` (#6765), the overlap schedule
  on by default (#6668), the V1 ZMQ path on the pinned ``sampled_token_ids``.

"Device" tensors are CPU tensors marked as device (``placement.py``); every host<->device
interaction goes through the active copy backend (``copy_backend.current()``)
so the sync census counts it. ``driver.py`` runs decode steps against either root.

The replica is never importable as ``fastdeploy``.
"""

ROOTS = {
    "fd24": "fd_async_copy_plugin.testing.reference.fd24",
    "fd25": "fd_async_copy_plugin.testing.reference.fd25",
    "fddev": "fd_async_copy_plugin.testing.reference.fddev",
}
