#!/usr/bin/env python3
"""Enable the plugin on a real FastDeploy source tree (or install) on CPU Paddle and report.

Proves, without a GPU, that the patches resolve and pass their compatibility checks on real
FastDeploy code, in the import order of FD's GPU worker (plugin hook first, runner imported later),
and that ``disable()`` restores the originals. FastDeploy's compiled ops are not available on CPU:
``--stub-ops`` replaces them by callables that forward ``*args`` like FD's op wrappers, so the
``stop_flag`` targets can be checked too (otherwise ``update_inputs_v1`` resolves to None and
``stop_flag`` is reported ``incompatible``, which is the correct answer for that environment; the
plugin's own ops must be built, ``fd-async-copy build-ops --no-cuda``, else it is ``skipped``).
The last line counts the links (one per feature and target) and the attributes they were installed
on (one ``Junction`` each), and checks that every attribute holds FastDeploy's original again.

    python tools/enable_on_real_fastdeploy.py --fd-src /path/to/FastDeploy [--stub-ops]

Nothing here fetches FastDeploy; point ``--fd-src`` at a checkout you have.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import types


class _OpStandIn:
    def __init__(self, name: str) -> None:
        self.__name__ = name

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self.__name__}: compiled FastDeploy op stand-in (CPU check)")


class _OpsStandIn(types.ModuleType):
    def __getattr__(self, name):
        return _OpStandIn(name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fd-src", required=True, help="directory containing the fastdeploy package")
    parser.add_argument("--stub-ops", action="store_true", help="stand-ins for FD's compiled ops")
    args = parser.parse_args(argv)

    scratch = tempfile.mkdtemp(prefix="fd-async-copy-check-")
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", scratch)
    os.chdir(scratch)  # FD writes ./log
    sys.path.insert(0, os.path.abspath(args.fd_src))

    import paddle

    paddle.set_device("cpu")
    import fastdeploy.model_executor.ops.gpu as gpu_ops

    gpu_ops.tolerant_import_error()
    if args.stub_ops:
        sys.modules["fastdeploy.model_executor.ops.gpu"] = _OpsStandIn("fastdeploy.model_executor.ops.gpu")

    import fd_async_copy_plugin as plugin

    before = plugin.enable(backend="host")
    print("after enable():", ", ".join(f"{k}={v['state']}" for k, v in before["features"].items()))
    import fastdeploy.worker.gpu_model_runner as runner  # what FD's worker imports after the hook

    status = plugin.status()
    print(f"profile: {status['profile']} (version string {status['fastdeploy_version']!r})")
    for name, entry in status["features"].items():
        print(f"  {name:15s} {entry['state']:9s} {entry['reason']}")
    # What the plugin replaced, as it recorded it: one record per feature and target (a link), one
    # Junction per patched attribute (the single function installed there, registry/patch.py). After
    # disable() each owner must hold FastDeploy's original again (identity, not equality) and no
    # junction may be left on it.
    from fd_async_copy_plugin.registry.patch import Junction

    records = [j for applied in plugin._get_manager().applied.values() for _, j in applied.records]
    per_feature = {name: len(applied.records) for name, applied in plugin._get_manager().applied.items()}
    first = {}  # every record of one attribute holds its junction's original: FastDeploy's object
    for record in records:
        first.setdefault((id(record.owner), record.name), record)
    plugin.disable()
    leftovers = []
    for record in first.values():
        current = vars(record.owner).get(record.name, None) if isinstance(record.owner, type) else getattr(
            record.owner, record.name, None)
        expected = record.original if record.own else None  # an inherited attribute is deleted again
        if current is not expected or Junction.at(record.owner, record.name) is not None:
            leftovers.append(f"{getattr(record.owner, '__name__', record.owner)}.{record.name}")
    restored = not leftovers
    print(f"disable(): enabled={plugin.status()['enabled']}, {len(records)} links on {len(first)} replaced "
          f"attributes ({', '.join(f'{k} {v}' for k, v in per_feature.items())}), "
          f"originals restored={restored} {leftovers or ''}")
    bad = [n for n, e in status["features"].items() if e["state"] == "failed"]
    return 1 if bad or not restored else 0


if __name__ == "__main__":
    sys.exit(main())
