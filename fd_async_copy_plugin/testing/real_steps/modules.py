"""The replica driver's view of a real FastDeploy tree (``driver.run_decode(..., modules=...)``).

The driver (``reference/driver.py``) plays the scheduler, the worker loop and the engine's
TokenProcessor around a runner. It reaches the runner's package through four names - ``config``,
``request`` (``Request``, ``RequestType``), ``sampling_params`` (``SamplingParams``) and the runner
- and ``FastDeployModules`` gives it FastDeploy's own: requests are FastDeploy ``Request`` objects
with FastDeploy ``SamplingParams``, inserted through FastDeploy's ``insert_tasks_v1``.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import time
import types

from .runner import build_runner


class FastDeployModules:
    root = "fastdeploy"

    def __init__(self) -> None:
        self.config = importlib.import_module("fastdeploy.config")
        fd_request = importlib.import_module("fastdeploy.engine.request")
        fd_params = importlib.import_module("fastdeploy.engine.sampling_params")

        def make_params(**given):
            """FastDeploy's ``SamplingParams.from_optional`` (the API server's path: unset
            penalties get FastDeploy's defaults)."""
            base = dict(n=1, best_of=None, presence_penalty=None, frequency_penalty=None, repetition_penalty=None,
                        temperature=None, top_p=None, top_k=0, min_p=0.0)
            accepted = inspect.signature(fd_params.SamplingParams.from_optional).parameters
            base.update({k: v for k, v in given.items() if k in accepted})
            params = fd_params.SamplingParams.from_optional(**base)
            for name, value in given.items():  # the dataclass fields from_optional does not take
                if name not in accepted:
                    setattr(params, name, value)
            return params

        self.sampling_params = types.SimpleNamespace(SamplingParams=make_params)
        self.runner = importlib.import_module("fastdeploy.worker.gpu_model_runner")

        def make_request(request_id, prompt_token_ids, eos_token_ids, sampling_params, idx=None, task_type=None,
                         block_tables=None):
            given = dict(
                request_id=request_id, prompt=None, prompt_token_ids=list(prompt_token_ids),
                prompt_token_ids_len=len(prompt_token_ids), messages=None, history=None, tools=None, system=None,
                eos_token_ids=list(eos_token_ids), arrival_time=time.time(), sampling_params=sampling_params,
            )
            accepted = inspect.signature(fd_request.Request.__init__).parameters  # 2.4 and 2.5 differ
            request = fd_request.Request(**{k: v for k, v in given.items() if k in accepted})
            request.idx = idx
            if task_type is not None:
                request.task_type = task_type
            if block_tables is not None:
                request.block_tables = list(block_tables)
            return request

        self.request = types.SimpleNamespace(Request=make_request, RequestType=fd_request.RequestType)

    @staticmethod
    def to_worker(task):
        """What the worker receives: FastDeploy's engine sends each scheduled task to the worker
        process through a queue, so the worker's ``insert_tasks_v1`` gets a copy (it pads
        ``sampling_params.stop_seqs_len`` in place: the engine's request never sees that)."""
        return copy.deepcopy(task)

    def build_runner(self, config, port):
        return build_runner(config, port)
