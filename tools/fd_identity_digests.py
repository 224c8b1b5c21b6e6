"""Print the normalised-AST digests (``fd_async_copy_plugin/fd_identity.py``) of a FastDeploy tree.

Usage: python tools/fd_identity_digests.py PATH/TO/fastdeploy [...]

Reads the source files with ``ast`` (imports nothing from FastDeploy) and prints one line per
reproduced body: its name and digest. Paste new digests into ``fd_identity.KNOWN`` only after
checking the body is semantically the one the plugin reproduces.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from fd_async_copy_plugin import fd_identity

SAMPLER = "model_executor/layers/sample/sampler.py"
OUTPUT = "worker/output.py"


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    found = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for sub in node.body:
                if isinstance(sub, ast.FunctionDef) and sub.name == name:
                    found = sub  # the last definition is the one Python binds
    return found


def digests(root: Path) -> dict[str, str]:
    tree = ast.parse((root / SAMPLER).read_text(encoding="utf-8"))
    gather = _method(tree, "Sampler", "gather_logprobs")
    out = {}
    if gather is not None:
        out["Sampler.gather_logprobs.maths"] = fd_identity.digest(fd_identity.gather_logprobs_maths(gather), gather.args)
    if (root / OUTPUT).is_file():
        slice_rows = _method(ast.parse((root / OUTPUT).read_text(encoding="utf-8")), "LogprobsTensors", "slice_rows")
        if slice_rows is not None:
            out["LogprobsTensors.slice_rows"] = fd_identity.digest(slice_rows.body, slice_rows.args)
    return out


def main(argv: list[str]) -> int:
    for arg in argv:
        for name, value in digests(Path(arg)).items():
            print(f"{arg}\t{name}\t{value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
