"""A fake FastDeploy source tree for the ``tools/real_fd`` row tests (AST checks of planted code)."""

from __future__ import annotations

import re
import textwrap


def plant(tmp_path, monkeypatch, prefix: str, files: dict[str, str], **replace) -> str:
    """Write ``files`` (path -> dedented text) as a package named ``prefix`` + the test's name (unique
    per case: sys.modules caches packages) and put it on sys.path; ``replace={"marker": "line"}``
    swaps the line that ends ``# @marker`` (keeping its indent). Returns the package's name."""
    name = prefix + re.sub(r"\W", "_", tmp_path.name)
    root = tmp_path / name
    for sub, text in files.items():
        lines = []
        for line in textwrap.dedent(text).splitlines():
            found = re.search(r"# @(\w+)$", line)
            if found and found.group(1) in replace:
                line = line[: len(line) - len(line.lstrip())] + replace[found.group(1)]
            lines.append(line)
        path = root / sub
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
        for folder in [path.parent, *path.parent.parents]:  # every package up to the root
            (folder / "__init__.py").touch()
            if folder == root:
                break
    monkeypatch.syspath_prepend(str(tmp_path))
    return name
