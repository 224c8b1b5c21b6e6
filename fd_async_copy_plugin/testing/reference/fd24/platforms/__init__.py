"""Mirrors ``fastdeploy/platforms/__init__.py``: a lazily built ``current_platform``.

The replica always reports CUDA, so FastDeploy's CUDA code paths (the ones the plugin patches)
are the ones taken, although tensors live on the CPU.
"""


class CUDAPlatform:
    device_name = "gpu"

    def is_cuda(self) -> bool:
        return True

    def is_xpu(self) -> bool:
        return False

    def is_iluvatar(self) -> bool:
        return False

    def is_gcu(self) -> bool:
        return False

    def is_dcu(self) -> bool:
        return False

    def is_maca(self) -> bool:
        return False

    def is_intel_hpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False


_current_platform = None


def __getattr__(name: str):
    if name == "current_platform":
        global _current_platform
        if _current_platform is None:
            _current_platform = CUDAPlatform()
        return _current_platform
    raise AttributeError(f"No attribute named '{name}' exists in {__name__}.")
