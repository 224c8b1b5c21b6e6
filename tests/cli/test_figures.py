"""One source per figure: every figure the README and docs quote from a recorded run is linked to
its file under ``benchmarks/results/`` and checked against that file.

Two checks:

- **pinned figures** (``FIGURES``): the headline figures, each read from its results file by a
  pattern and required, as a link to that file, on the doc line that quotes it. After a new
  recorded run the test names each stale figure and the value the file now holds: edit the doc.
- **every linked figure**: a link whose text is a figure (``[0.925x](../benchmarks/results/X.txt)``
  or ``[0.925x][ref]``) must point at a results file that exists and holds that figure.

``benchmarks/results/`` keeps one file per benchmark (the latest recorded run, naming its date,
commit and machine); older runs live in git history.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: a results file's name starts with its benchmark's: a bare ``cuda_layer_check_old.txt`` in a doc counts
BENCHMARK_STEMS = "(?:" + "|".join(sorted(p.stem for p in (REPO / "benchmarks").iterdir()
                                          if p.suffix in (".py", ".cu") and not p.stem.startswith("_"))
                                   + ["bench_cpu"]) + ")"


def _row(config: str, variant: str, column: int = 3) -> str:
    """A step_model.txt cell: ``variant``'s row in ``config``'s block, ``column`` after the name
    (0 ms/step, 1 p10, 2 p90, 3 vs fd24 / vs fd25, 4 vs gpu in FD 2.5's block)."""
    return rf"config {config}:(?:.*\n)*?  {re.escape(variant)} {{2,}}(?:\S+\s+){{{column}}}(\d\.\d+x)"


def _target(config: str, mode: str) -> str:
    """A step_model.txt verdict line's ratio, e.g. ``target tpot11: overlap bound / fd24 = 0.798``."""
    return rf"^target {config}: overlap {mode}\b[^=]*/ fd24 = (\d\.\d+)"


STEP_MODEL = "step_model.txt"
#: The recorded step-model run predates the renaming of the overlap's token counts: its variant
#: ``exact, at launch`` is today's ``exact`` (the default), its ``overlap, exact`` variant and the
#: verdict lines "target ...: overlap exact" are today's ``prepare``.
EXACT = "exact, at launch"
#: (doc, a text that picks the doc's line, results file, pattern whose group 1 is the figure,
#: format of the figure as the doc links it)
FIGURES = [
    ("README.md", "| FD 2.4 + plugin, default features |", STEP_MODEL, _row("tpot11", "fd24+one-wait"), "{}"),
    ("README.md", "| FD 2.4 + plugin, default features |", STEP_MODEL, _row("hostheavy", "fd24+one-wait"), "{}"),
    ("README.md", "`exact` count |", STEP_MODEL, _row("tpot11", EXACT), "{}"),
    ("README.md", "`exact` count |", STEP_MODEL, _row("hostheavy", EXACT), "{}"),
    ("README.md", "`prepare` count |", STEP_MODEL, _target("tpot11", "exact"), "{}x"),
    ("README.md", "`prepare` count |", STEP_MODEL, _target("hostheavy", "exact"), "{}x"),
    ("README.md", "`bound` count |", STEP_MODEL, _target("tpot11", "bound"), "{}x"),
    ("README.md", "`bound` count |", STEP_MODEL, _target("hostheavy", "bound"), "{}x"),
    ("README.md", "| FD 2.5 + plugin, overlap off |", STEP_MODEL, _row("tpot11", "fd25+plugin"), "{}"),
    ("README.md", "| FD 2.5 + plugin, overlap off |", STEP_MODEL, _row("hostheavy", "fd25+plugin"), "{}"),
    ("README.md", "| FD 2.5, its own overlap, unpatched |", STEP_MODEL, _row("tpot11", "fd25-overlap"), "{}"),
    ("README.md", "| FD 2.5, its own overlap, unpatched |", STEP_MODEL, _row("hostheavy", "fd25-overlap"), "{}"),
    ("README.md", "| FD 2.5, its own overlap + plugin |", STEP_MODEL, _row("tpot11", "fd25+plugin-overlap"), "{}"),
    ("README.md", "| FD 2.5, its own overlap + plugin |", STEP_MODEL, _row("hostheavy", "fd25+plugin-overlap"), "{}"),
    ("README.md", "cuda_layer_check: ", "cuda_layer_check.txt", r"^RESULT: (\w+)", "{}"),
    ("README.md", "selftest_kernel_compare: ", "selftest_kernel_compare.txt", r"^RESULT: (\w+)", "{}"),
    ("docs/bit-identity.md", "| `exact` (default) |", STEP_MODEL, _row("tpot11", EXACT), "{}"),
    ("docs/bit-identity.md", "| `exact` (default) |", STEP_MODEL, _row("hostheavy", EXACT), "{}"),
    ("docs/bit-identity.md", "| `prepare` |", STEP_MODEL, _target("tpot11", "exact"), "{}x"),
    ("docs/bit-identity.md", "| `prepare` |", STEP_MODEL, _target("hostheavy", "exact"), "{}x"),
    ("docs/bit-identity.md", "| `bound` |", STEP_MODEL, _target("tpot11", "bound"), "{}x"),
    ("docs/bit-identity.md", "| `bound` |", STEP_MODEL, _target("hostheavy", "bound"), "{}x"),
    ("docs/overlap-token-count.md", "| `overlap`, `exact` (default) |", STEP_MODEL, _row("tpot11", EXACT), "{}"),
    ("docs/overlap-token-count.md", "| `overlap`, `exact` (default) |", STEP_MODEL, _row("hostheavy", EXACT), "{}"),
    ("docs/overlap-token-count.md", "| `overlap`, `prepare` |", STEP_MODEL, _target("tpot11", "exact"), "{}x"),
    ("docs/overlap-token-count.md", "| `overlap`, `bound` |", STEP_MODEL, _target("hostheavy", "bound"), "{}x"),
    ("docs/features.md", "| `overlap` (**opt-in**", STEP_MODEL, _row("tpot11", EXACT), "{}"),
    ("docs/features.md", "| `overlap` (**opt-in**", STEP_MODEL, _target("tpot11", "exact"), "{}x"),
    ("docs/features.md", "| `overlap` (**opt-in**", STEP_MODEL, _target("tpot11", "bound"), "{}x"),
    ("docs/gpu-acceptance.md", "`bound` modelled", STEP_MODEL, _target("tpot11", "bound"), "{}x"),
    ("docs/gpu-acceptance.md", "`bound` modelled", STEP_MODEL, _target("hostheavy", "bound"), "{}x"),
    ("docs/gpu-acceptance.md", "`exact` modelled", STEP_MODEL, _row("tpot11", EXACT), "{}"),
    ("docs/gpu-acceptance.md", "`exact` modelled", STEP_MODEL, _row("hostheavy", EXACT), "{}"),
    ("docs/gpu-acceptance.md", "`prepare` modelled", STEP_MODEL, _target("tpot11", "exact"), "{}x"),
    ("docs/gpu-acceptance.md", "`prepare` modelled", STEP_MODEL, _target("hostheavy", "exact"), "{}x"),
    # the host cost of the copies (few on purpose: new H200 runs replace these files)
    ("docs/verification.md", "GPU busy, producer:", "cuda_layer_check.txt",
     r"^## run \d+, one copy path(?:.*\n)*?  GPU busy \(~2\.0 ms(?:.*\n)*?    plugin: ring \+ event +(\d+\.\d) us",
     "{} us"),
    ("docs/verification.md", "GPU busy, producer:", "cuda_layer_check.txt",
     r"^## run \d+, one copy path(?:.*\n)*?  GPU busy \(~2\.0 ms(?:.*\n)*?    FD 2\.4: blocking copies +(\d+\.\d) us",
     "{} us"),
    ("docs/verification.md", "CPU bench ratio:", "bench-cpu.txt", r"^ratio plugin/unpatched \(median\): (\d\.\d+)", "{}"),
]

_INLINE = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_REF = re.compile(r"\[([^\]]+)\]\[([^\]]+)\]")
_DEF = re.compile(r"^\[([^\]]+)\]:\s*(\S+)", re.M)


def links(text: str, line: str | None = None) -> list[tuple[str, str]]:
    """(link text, target) of every inline and reference link of ``line`` (or all of ``text``)."""
    defs = {name.lower(): target for name, target in _DEF.findall(text)}
    scope = text if line is None else line
    found = _INLINE.findall(scope)
    found += [(label, defs[ref.lower()]) for label, ref in _REF.findall(scope) if ref.lower() in defs]
    return found


def _results_name(target: str) -> str | None:
    found = re.search(r"benchmarks/results/([\w.-]+)$", target.split("#")[0])
    return found.group(1) if found else None


def pinned_problems(docs: dict[str, str], results: dict[str, str], figures=FIGURES) -> list[str]:
    """What the pinned figures get wrong: a doc line missing, or not linking the recorded figure."""
    problems = []
    for doc, needle, name, pattern, form in figures:
        found = re.search(pattern, results.get(name, ""), re.M)
        if found is None:
            problems.append(f"{name}: pattern {pattern!r} finds nothing (the figure {doc} quotes)")
            continue
        figure = form.format(found.group(1))
        lines = [line for line in docs[doc].splitlines() if needle in line]
        if not lines:
            problems.append(f"{doc}: no line holds {needle!r} (it quotes {figure} from {name})")
            continue
        if not any((figure, name) in {(text, _results_name(t)) for text, t in links(docs[doc], line)}
                   for line in lines):
            problems.append(f"{doc}: the line with {needle!r} must link [{figure}] to benchmarks/results/{name} "
                            f"(the recorded run's figure)")
    return problems


def linked_problems(docs: dict[str, str], results: dict[str, str]) -> list[str]:
    """Links into benchmarks/results/: the file exists; a figure link's text occurs in that file."""
    problems = []
    for doc, text in docs.items():
        for label, target in links(text):
            name = _results_name(target)
            if name is None:
                continue
            if name not in results:
                problems.append(f"{doc}: [{label}] links benchmarks/results/{name}, which does not exist")
            elif re.search(r"\d", label):
                figure = re.sub(r"^[~+]", "", label.strip())
                if not re.search(rf"(?<![\w.]){re.escape(figure)}(?![\d])", results[name]):
                    problems.append(f"{doc}: [{label}] is not in benchmarks/results/{name}")
        named = set(re.findall(r"benchmarks/results/([\w.*-]+\.txt)", text))
        named |= {found for found in re.findall(r"(?<![\w/.-])([\w*-]+\.txt)\b", text)
                  if re.match(BENCHMARK_STEMS, found.replace("-", "_"))}
        for name in sorted(named):
            if name not in results:
                problems.append(f"{doc}: names benchmarks/results/{name}, which does not exist")
    return problems


def _docs() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text() for p in DOCS}


def _results() -> dict[str, str]:
    return {p.name: p.read_text() for p in RESULTS.iterdir() if p.is_file()}


def test_every_pinned_figure_is_the_recorded_runs():
    assert pinned_problems(_docs(), _results()) == []


def test_every_linked_figure_is_in_the_file_it_links():
    assert linked_problems(_docs(), _results()) == []


def test_a_planted_mismatch_fails_both_checks():
    docs, results = _docs(), _results()
    exact = re.search(_target("tpot11", "exact"), results[STEP_MODEL], re.M).group(1)  # prepare's (see EXACT)
    # the README quotes another figure than the recorded run
    planted = dict(docs, **{"README.md": docs["README.md"].replace(f"[{exact}x]", "[0.001x]", 1)})
    assert any("`prepare` count" in p and f"[{exact}x]" in p for p in pinned_problems(planted, results))
    assert any("[0.001x] is not in benchmarks/results/step_model.txt" in p for p in linked_problems(planted, results))
    # a new recorded run whose figure the README does not quote yet
    rerun = dict(results, **{STEP_MODEL: results[STEP_MODEL].replace(f"fd24 = {exact} ", "fd24 = 0.111 ")})
    assert any("[0.111x]" in p and "README.md" in p for p in pinned_problems(docs, rerun))
    # a link to a results file that is gone
    gone = dict(docs, **{"docs/x.md": "see [0.5x](../benchmarks/results/old_run_after3.txt)"})
    assert any("old_run_after3.txt, which does not exist" in p for p in linked_problems(gone, results))
    bare = dict(docs, **{"docs/x.md": "as `cuda_layer_check_after3.txt` showed"})
    assert linked_problems(bare, results) == ["docs/x.md: names benchmarks/results/cuda_layer_check_after3.txt, "
                                              "which does not exist"]
    # a figure that is not a link to its file: the pinned check wants the link
    unlinked = dict(docs, **{"README.md": docs["README.md"].replace(f"[{exact}x][sm]", f"{exact}x", 1)})
    assert pinned_problems(unlinked, results)


def test_the_reference_links_resolve_as_inline_ones():
    text = "| a | [1.5x][r] | [2x](../benchmarks/results/b.txt) |\n\n[r]: benchmarks/results/a.txt\n"
    assert links(text, text.splitlines()[0]) == [("2x", "../benchmarks/results/b.txt"), ("1.5x", "benchmarks/results/a.txt")]


def test_results_hold_one_file_per_benchmark_naming_date_commit_and_machine():
    scripts = {p.stem for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".cu")}
    for path in sorted(RESULTS.iterdir()):
        stem = path.stem.replace("-", "_")
        assert stem in scripts or stem == "bench_cpu", f"{path.name}: not one benchmark's file (older runs: git log)"
        head = "\n".join(path.read_text().splitlines()[:6])
        assert re.search(r"20\d\d-\d\d-\d\d", head), f"{path.name}: no date in its first lines"
        assert re.search(r"\b[0-9a-f]{7,40}\b", head), f"{path.name}: no commit in its first lines"
        assert re.search(r"H100|H200|CPU|core", head), f"{path.name}: no machine in its first lines"
