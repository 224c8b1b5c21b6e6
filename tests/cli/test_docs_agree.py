"""The docs, the CLI's help and the API's docstrings say the same thing (each check fails on the
disagreement it was written for: a planted copy of it is checked too)."""

from __future__ import annotations

import re
from pathlib import Path

import fd_async_copy_plugin
from fd_async_copy_plugin.cli import build_parser
from fd_async_copy_plugin.registry.catalog import feature_catalog

KNOWN_FEATURES, OPT_IN_FEATURES = feature_catalog().names, feature_catalog().opt_in

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _subparser(name: str):
    parser = build_parser()
    action = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return action.choices[name]


def test_enable_docstring_names_every_feature_and_the_opt_in():
    doc = fd_async_copy_plugin.enable.__doc__
    assert all(f"``{name}``" in doc for name in KNOWN_FEATURES), [n for n in KNOWN_FEATURES if f"``{n}``" not in doc]
    assert all(name in doc.split("opt-in")[1][:40] for name in OPT_IN_FEATURES)


def broken_links(pages: dict[Path, str]) -> list[str]:
    """Relative links of the pages whose file does not exist (anchors and URLs are not checked)."""
    problems = []
    for page, text in pages.items():
        targets = re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r"^\[[^\]]+\]:\s*(\S+)", text, re.M)
        for target in targets:
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            if not (page.parent / path).exists():
                problems.append(f"{page.relative_to(REPO)}: {target}")
    return problems


def test_every_relative_link_of_readme_and_docs_resolves():
    pages = {page: page.read_text() for page in PAGES}
    assert broken_links(pages) == []
    planted = {REPO / "docs" / "verification.md": "labels from [x](docs/fd24-step-syncs.md)"}
    assert broken_links(planted) == ["docs/verification.md: docs/fd24-step-syncs.md"]


def test_the_features_page_gives_selftest_backend_as_the_cli_takes_it():
    choices = next(a for a in _subparser("selftest")._actions if "--backend" in a.option_strings).choices
    usage = re.search(r"`fd-async-copy selftest (?:\[--[^\]]*\] )*\[--backend ([^\]]+)\]", (REPO / "docs" / "features.md").read_text())
    assert usage, "docs/features.md: no selftest usage with --backend"
    assert usage.group(1).replace("\\|", "|").split("|") == list(choices)


def test_ab_help_names_the_request_sets_widths_and_every_exit_code_the_docs_give():
    from fd_async_copy_plugin.serving_ab.request_set import TOP_LOGPROBS

    help_text = " ".join(_subparser("ab").format_help().split())
    widths = "/".join("none" if k is None else str(k) for k in TOP_LOGPROBS)
    assert f"top-k {widths}" in help_text
    page = " ".join((REPO / "docs" / "gpu-acceptance.md").read_text().split())
    assert f"top-k {widths}" in page
    documented = set(re.findall(r"\*\*(\d)\*\* ", page.split("Exit codes:")[1][:900]))
    in_help = set(re.findall(r"(\d): ", help_text.split("Exit 0:")[1][:200])) | {"0"}
    assert documented == in_help == {"0", "1", "2", "3", "4"}, (documented, in_help)


def test_fd24_waits_per_step_are_seven_wherever_a_page_counts_them():
    counted = [(page.name, m.group(1)) for page in PAGES
               for m in re.finditer(r"FD 2\.4's (\w+) (?:host )?waits", page.read_text())]
    assert counted and all(n in ("seven", "7") for _, n in counted), counted
