"""Replica of FastDeploy develop (2.6-dev; ``gongshaotian/FastDeploy`` ``develop``) at the plugin's
patch points, as a delta over the 2.5 replica.

What develop changed there, and only that, is modelled (``docs/verification.md``, "FD develop"):

- ``GPUModelRunner`` has no ``not_need_stop()`` and no ``_preprocess_and_execute_model`` (#6356:
  the worker loop's ``hasattr`` guard, worker_process.py:608-611, always runs ``execute_model``);
  ``_preprocess`` / ``_execute`` / ``_postprocess`` / ``_save_model_output``, the token count
  resolved by ``_resolve_current_launch_token_num`` (gpu_model_runner.py:308-331);
- ``infer_seed`` (and its increment) on the device (#6765, input_batch.py:175,
  gpu_model_runner.py:210-212): the sampler's seed transform (T) is gone;
- a DECODE task no longer reads ``is_block_step`` on the host (#6356, gpu_model_runner.py:911-925);
- the V1 ZMQ save path sends the pinned ``sampled_token_ids`` (pre_and_post_process.py:378-394);
- the overlap schedule is on by default (#6668, engine/args_utils.py:444).

Pieces unchanged from 2.5 at the patch points are re-exported from the 2.5 replica; every class or
function at a patch point is this root's own.
"""

__version__ = "2.6.0-dev"
