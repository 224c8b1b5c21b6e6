"""A runner's step context: what a runner's FastDeploy call hands down to the FastDeploy functions
it calls without the runner (``get_padding_offset``, ``save_output(_topk)``, ``update_inputs_v1``,
``Sampler.gather_logprobs``, ``paddle.device.synchronize``). The line's function of the calling
method opens a ``Step`` for the duration of FastDeploy's call; they find it with ``current()``.

The one place that keys step state by thread: runners stepped by threads of one process
(tensor-parallel ranks) each see their own step, another thread sees none. A step opened inside
another of the same runner (``_prepare_inputs`` in ``execute_model``) starts from its fields.
"""

from __future__ import annotations

import threading


class Step:
    """One runner's call in progress on one thread (its fields: class defaults until set)."""

    runner = None
    #: FD 2.4, overlap: the ``OverlapState`` that captures this step's saves
    saves = None
    #: FD 2.4, step_syncs: (``StepShadow``, count) - the token count ``get_padding_offset`` gets
    count = None
    #: FD 2.5, step_syncs: the runner's ``_postprocess`` runs (``update_inputs_v1`` issues its snapshot)
    posting = False
    #: inside ``_get_prompt_logprobs_list`` (logprobs, sync_scope)
    prompt = False
    #: FD 2.5, step_syncs: inside ``_prepare_inputs``, ``paddle.device.cuda.create_event()`` returns
    #: ``make_event(event)`` (FastDeploy's ``token_num_event`` made deferrable)
    make_event = None


_OPEN: dict[int, Step] = {}  # thread ident -> the step open on that thread


def current() -> Step | None:
    """The step open on this thread, if any."""
    return _OPEN.get(threading.get_ident())


def prompt_runner():
    """The runner whose ``_get_prompt_logprobs_list`` runs on this thread (None outside it)."""
    step = _OPEN.get(threading.get_ident())
    return step.runner if step is not None and step.prompt else None


class opened:
    """``with opened(runner, **fields)``: a step of ``runner`` on this thread, with ``fields`` set,
    for the duration of the block (a class: cheaper per call than a generator)."""

    __slots__ = ("me", "outer", "step")

    def __init__(self, runner, **fields) -> None:
        self.me = threading.get_ident()
        self.outer = outer = _OPEN.get(self.me)
        self.step = step = Step()
        if outer is not None and outer.runner is runner:
            step.__dict__.update(outer.__dict__)
        step.runner = runner
        step.__dict__.update(fields)

    def __enter__(self) -> Step:
        _OPEN[self.me] = self.step
        return self.step

    def __exit__(self, *exc) -> None:
        if self.outer is None:
            _OPEN.pop(self.me, None)
        else:
            _OPEN[self.me] = self.outer
