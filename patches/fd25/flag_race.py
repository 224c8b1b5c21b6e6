"""Feature ``flag_race``: FastDeploy 2.5's insert-time ``set_stop(True)`` is never overwritten by an
older in-flight copy of the stop flag.

Why:    With ``--enable-overlap-schedule``, 2.5's ``insert_tasks_v1`` calls
        ``set_stop(not_need_stop, True)`` on the pinned host flag while the previous step's
        ``not_need_stop.copy_(not_need_stop_device, False)`` may still be in flight. When it lands it
        writes False back (after a step whose only request was a non-final prefill chunk, which
        ``update_inputs_v1`` marks stopped), ``_postprocess`` returns early, and a 2-chunk prompt
        stalls for good. Today a GPU hides it: the insert's synchronous pageable H2D copies wait for
        the stream first. It becomes live as soon as insert-time writes stop being synchronous.
How:    Before an insert that carries tasks, wait for the event of the last step's post-processing
        (``last_post_process_event``, recorded after that flag copy): the same wait the synchronous
        H2D makes today, so it costs nothing now and closes the race by construction later.
Mirrors: nothing upstream (found by this plugin's simulator; FastDeploy develop no longer reads the
        host flag, #6356).
FD:     2.5 (``native`` elsewhere: 2.4 has no asynchronous flag copy - the plugin's own ``stop_flag``
        waits before every insert - and develop does not use the host flag).
Delete: when FastDeploy 2.5 is no longer served.
"""

from __future__ import annotations

from fd_async_copy_plugin.registry.patch import Feature, Patch, Target

from ..runner import line

RUNNER = "worker.gpu_model_runner"


class FlagRaceFeature(Feature):
    name = "flag_race"
    mirrors = "a hardening of FastDeploy 2.5's overlap schedule (#6259): set_stop at insert after the flag copy"
    profiles = {"fastdeploy-2.4": "native: FastDeploy 2.4 copies the flag synchronously (the plugin's stop_flag "
                                  "waits before every insert)",
                "fastdeploy-2.5": "apply",
                "fastdeploy-2.6+": "native: FastDeploy develop no longer reads the host flag (#6356)"}
    patches = (Patch(Target(RUNNER, "GPUModelRunner.insert_tasks_v1"), line("insert_tasks_v1")),)


FEATURES = [FlagRaceFeature()]
