"""Mirrors ``fastdeploy/model_executor/ops/gpu`` (develop): the 2.5 replica's ops. develop's
``update_inputs_v1`` gets ``not_need_stop_device`` as 2.5's does (pre_and_post_process.py:341-355)."""

from .....fd25.model_executor.ops.gpu import *  # noqa: F401,F403  (unchanged from the 2.5 replica)
from .....fd25.model_executor.ops.gpu import get_stop, recover_decode_task, set_stop  # noqa: F401
