"""A third-party patch set (tests/registry/test_third_party_patch_set.py): a distribution of its own
(the dist-info beside it), registered in the ``fd_async_copy`` entry-point group through the same
hook specs as the built-in set. Its one feature, ``call_counter``, counts the calls of the FD
replica's ``GPUModelRunner.exist_prefill`` (FD 2.4) and changes nothing."""

import pluggy

hookimpl = pluggy.HookimplMarker("fd_async_copy")  # the project name alone: no import of the plugin
CALLS = []


@hookimpl
def fd_async_copy_catalog():
    return {"call_counter": "opt-in"}


@hookimpl
def fd_async_copy_features():
    from fd_async_copy_plugin.registry import Feature, Patch, Target, wraps

    def build(original, ctx):
        @wraps(original)
        def exist_prefill(self, *args, **kwargs):
            CALLS.append(type(self).__name__)
            return original(self, *args, **kwargs)

        return exist_prefill

    class CallCounter(Feature):
        name = "call_counter"
        mirrors = "nothing (a third-party example)"
        profiles = {"fastdeploy-2.4": "apply", "fastdeploy-2.5": "native: not needed there"}
        patches = (Patch(Target("worker.gpu_model_runner", "GPUModelRunner.exist_prefill"), build),)

    return [CallCounter()]
