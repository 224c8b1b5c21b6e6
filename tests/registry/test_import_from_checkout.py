"""The package imports from a checkout as installed code does (issue 21): ``patches/`` at the top of
the repository is ``fd_async_copy_plugin.patches`` through a link, so neither ``PYTHONPATH=<checkout>``
nor a non-editable install run from the repository root (where the source package shadows the
installed one) loses it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path


CHECKOUT = Path(__file__).resolve().parents[2]

#: drops the editable install's import hook: only sys.path decides where the package comes from
PROBE = """
import json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f)]
import fd_async_copy_plugin as p
p.register()
p.enable(backend="host")  # no FastDeploy here: every feature skipped; enabled False, enabled_reason says enable() ran (issue 41)
import fd_async_copy_plugin.patches as patches, fd_async_copy_plugin.patches.fd24.stop_flag
print(json.dumps({"package": p.__file__, "patches": patches.__file__, "enabled": "enabled_reason" in p.status()}))
p.disable()
"""


def _probe(cwd: Path, pythonpath: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FD_ASYNC_COPY")}
    env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pythonpath_checkout(tmp_path):
    found = _probe(tmp_path, str(CHECKOUT))
    assert found["package"].startswith(str(CHECKOUT)) and found["enabled"], found
    assert Path(found["patches"]).resolve() == CHECKOUT / "patches" / "__init__.py"


def test_non_editable_install_run_from_the_repository_root(tmp_path, checkout_wheel):
    wheel, site = checkout_wheel, tmp_path / "site"
    names = zipfile.ZipFile(wheel).namelist()
    assert "fd_async_copy_plugin/patches/fd24/stop_flag.py" in names and "patches/fd24/stop_flag.py" not in names
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    assert not (site / "fd_async_copy_plugin" / "patches").is_symlink()  # the files themselves
    found = _probe(CHECKOUT, str(site))  # '' (the repository root) comes first: the checkout shadows
    assert found["package"].startswith(str(CHECKOUT)) and found["enabled"], found
