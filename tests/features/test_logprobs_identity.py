"""Defect 1 of issue 13: the plugin runs its own copy of FastDeploy's gather_logprobs maths, so it
may only replace a body that is exactly FastDeploy's (normalised-AST digest, ``fd_identity``)."""

from __future__ import annotations

import importlib
import os
import shutil
import sys

import pytest

import fd_async_copy_plugin
from fd_async_copy_plugin import fd_identity
from fd_async_copy_plugin.patches import logprobs as logprobs_patch
from fd_async_copy_plugin.profile import root_directory
from fd_async_copy_plugin.testing.reference import ROOTS

SAMPLER = "model_executor.layers.sample.sampler"
CLIP = "logprobs.clip_(min=paddle.finfo(logprobs.dtype).min)"


@pytest.fixture
def fd24_copy(tmp_path, monkeypatch):
    """A copy of the fd24 replica as its own top-level package, whose sampler a test can edit."""
    # The whole reference package is copied (the replica imports its shared helpers from it), under
    # a package that hands it the plugin's one runtime (the copy backend in use must be shared).
    package = f"fdid_{abs(hash(str(tmp_path)))}"
    reference = os.path.dirname(root_directory(ROOTS["fd24"]))
    shutil.copytree(reference, tmp_path / package / "testing" / "reference", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / package / "testing" / "__init__.py").write_text("")
    (tmp_path / package / "__init__.py").write_text(
        "import sys\nfrom fd_async_copy_plugin import runtime\nsys.modules[__name__ + '.runtime'] = runtime\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fd_async_copy_plugin.disable()
    yield f"{package}.testing.reference.fd24", tmp_path / package / "testing" / "reference" / "fd24" / "model_executor" / "layers" / "sample" / "sampler.py"
    fd_async_copy_plugin.disable()
    for module in [m for m in sys.modules if m == package or m.startswith(package + ".")]:
        del sys.modules[module]


def _edit_gather(sampler_py, old: str, new: str) -> None:
    """Replace the first ``old`` inside ``Sampler.gather_logprobs`` (not elsewhere in the file)."""
    text = sampler_py.read_text()
    start = text.index("    def gather_logprobs(")
    assert old in text[start:], old
    sampler_py.write_text(text[:start] + text[start:].replace(old, new, 1))


def _enable(root: str) -> tuple[dict, object]:
    sampler = importlib.import_module(f"{root}.{SAMPLER}").Sampler
    original = sampler.__dict__["gather_logprobs"]
    importlib.import_module(f"{root}.worker.gpu_model_runner")
    status = fd_async_copy_plugin.enable(features=["logprobs"], backend="host", root=root)
    return status["features"]["logprobs"], (sampler.__dict__["gather_logprobs"] is original)


def test_unmodified_copy_is_patched(fd24_copy):
    root, _ = fd24_copy
    state, untouched = _enable(root)
    assert state["state"] == "applied", state
    assert not untouched


@pytest.mark.parametrize(
    "old, new",
    [
        (CLIP, "logprobs.clip_(min=-1e4)"),  # a cherry-picked constant: same calls, other maths
        ("axis=-1)\n", "axis=-1, largest=True)\n"),  # an extra keyword
        # more than a copy after the maths
        ("return LogprobsTensors(indices, top_logprobs, token_ranks)",
         "return LogprobsTensors(indices, top_logprobs.astype('float32'), token_ranks)"),
    ],
    ids=["clip-constant", "extra-keyword", "tail-cast"],
)
def test_modified_gather_logprobs_is_incompatible_and_fd_runs_unpatched(fd24_copy, old, new):
    root, sampler_py = fd24_copy
    _edit_gather(sampler_py, old, new)
    state, untouched = _enable(root)
    assert state["state"] != "applied", state
    assert state["state"] == "incompatible", state
    if "return" not in old:
        found = fd_identity.gather_logprobs_digest(importlib.import_module(f"{root}.{SAMPLER}").Sampler.gather_logprobs)
        assert found in state["reason"]
    assert untouched, "FastDeploy's gather_logprobs must stay in place"


def test_replicas_match_the_digest_of_real_fastdeploy():
    """The digests in fd_identity were computed from the real FD trees (tools/fd_identity_digests.py);
    the replica must have the same maths, or it is not a replica."""
    for version, profile in (("fd24", "fastdeploy-2.4"), ("fd25", "fastdeploy-2.5")):
        sampler = importlib.import_module(f"{ROOTS[version]}.{SAMPLER}").Sampler
        found = fd_identity.gather_logprobs_digest(sampler.gather_logprobs)
        assert fd_identity.check("Sampler.gather_logprobs.maths", profile, found) is None, found


def test_the_plugins_own_maths_is_the_known_body():
    """The plugin's replacement runs the same statements (after its platform pass-through)."""
    import ast

    node = fd_identity.function_node(logprobs_patch.build_gather_logprobs)
    inner = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "gather_logprobs")
    maths = fd_identity.gather_logprobs_maths(type(inner)(**{**inner.__dict__, "body": inner.body[1:]}))
    found = fd_identity.digest(maths, inner.args)
    assert fd_identity.check("Sampler.gather_logprobs.maths", "fastdeploy-2.4", found) is None, found


def test_docstrings_and_comments_do_not_change_the_digest(fd24_copy):
    root, sampler_py = fd24_copy
    _edit_gather(sampler_py, CLIP, f"# a comment\n        {CLIP}  # another")
    state, untouched = _enable(root)
    assert state["state"] == "applied", state
