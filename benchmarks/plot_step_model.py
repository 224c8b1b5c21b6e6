"""Render the recorded step model (``benchmarks/results/step_model.txt``) as a PNG chart.

    python benchmarks/plot_step_model.py [--input benchmarks/results/step_model.txt]
                                         [--output docs/step_model.png]

One panel per modelled configuration (``tpot11``: GPU-bound, ``hostheavy``: host-bound), one bar
per variant: FD 2.4, the backport (#6176 + #6362), one wait per step (``step_syncs``), FD 2.5's
overlap with its sampler wait T kept, the plugin's overlap with the exact token count waited for
before the prepare (``prepare``) and at the forward's launch (``exact``, the default) and with FD
2.5's upper bound, and the GPU-only floor. Each bar is the median time per
decode step, split into the host's own work ("host") and the time the host spends blocked in
waits ("waited"), as ``step_model.py`` measured them; the label names the sites the host waits at
in each step (FD 2.4's S1-S7 and T, the plugin's one save ``event``). Below a line, when the file
has them, FD 2.5's variants (``tn``/``tn2``: its token-count event), their ratios against FD 2.5.

Everything drawn comes from the results file (``parse`` reads it; nothing is typed in here), so
re-running ``step_model.py`` on another GPU and then this script redraws the picture. The numbers
are modelled decode steps (spin kernels and busy-waits at FD 2.4's sites), not FastDeploy
measurements, and the chart says so. Needs matplotlib: ``pip install .[plot]``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_INPUT = os.path.join(HERE, "results", "step_model.txt")
DEFAULT_OUTPUT = os.path.join(os.path.dirname(HERE), "docs", "step_model.png")

#: step_model.py's variant names -> the chart's labels, in the order drawn (top to bottom)
VARIANTS = (
    ("fd24", "FD 2.4"),
    ("fd24+backport", "backport (#6176+#6362)"),
    ("fd24+one-wait", "one wait (step_syncs)"),
    ("overlap, T kept", "FD 2.5 overlap (T kept)"),
    ("overlap, prepare", "overlap, prepare"),
    ("exact, at launch", "overlap, exact (default)"),
    ("fd24+overlap", "overlap, bound"),
    ("gpu-only", "GPU only"),
)
#: variant names of results recorded before the overlap's token counts were renamed -> today's
RENAMED = {"overlap, exact": "overlap, prepare"}
#: FD 2.5's variants (step_model.py's "FD 2.5" block: ratios against ``fd25``), drawn below FD 2.4's
#: when the file has them (results recorded before they existed have none)
FD25_VARIANTS = (
    ("fd25", "FD 2.5"),
    ("fd25-overlap", "FD 2.5 overlap"),
    ("fd25+plugin", "FD 2.5 + plugin"),
    ("fd25+plugin-overlap", "FD 2.5 overlap + plugin"),
)

_CONFIG = re.compile(
    r"^config (?P<name>\S+): forward (?P<forward>[\d.]+) ms, sampler (?P<sampler>[\d.]+) ms of GPU work; "
    r"host prepare (?P<prepare>[\d.]+) / between (?P<between>[\d.]+) / save (?P<save>[\d.]+) ms"
)
_ROW = re.compile(
    r"^\s+(?P<name>\S.*?)\s{2,}(?P<ms>[\d.]+)\s+(?P<p10>[\d.]+)\s+(?P<p90>[\d.]+)\s+(?P<ratio>[\d.]+)x\s+"
    r"(?P<model>[\d.]+)\s+(?P<mratio>[\d.]+)x\s+(?P<waited>[\d.]+)\s+(?P<host>[\d.]+)\s+(?P<waits>.*)$"
)
#: a row of the FD 2.5 block: one more ratio column (``vs fd25``, then ``vs gpu``)
_ROW25 = re.compile(
    r"^\s+(?P<name>fd25\S*)\s+(?P<ms>[\d.]+)\s+(?P<p10>[\d.]+)\s+(?P<p90>[\d.]+)\s+(?P<ratio>[\d.]+)x\s+"
    r"(?P<gpu>[\d.]+)x\s+(?P<model>[\d.]+)\s+(?P<mratio>[\d.]+)x\s+(?P<waited>[\d.]+)\s+(?P<host>[\d.]+)\s+(?P<waits>.*)$"
)
_WAIT = re.compile(r"(?P<site>[\w.]+) (?P<count>\d+)x(?P<us>\d+)")


class ParseError(ValueError):
    """The results file does not have the shape ``step_model.py`` writes."""


@dataclass
class Row:
    name: str
    ms: float
    p10: float
    p90: float
    ratio: float
    waited: float
    host: float
    #: (site, count per step, median us) as step_model.py lists them
    waits: list[tuple[str, int, int]] = field(default_factory=list)

    @property
    def wait_sites(self) -> list[str]:
        """The blocking points, a copy's parts (``T.h2d``, ``S5.d2h``) folded into their site."""
        out: list[str] = []
        for site, _, _ in self.waits:
            base = site.split(".")[0]
            if base not in out:
                out.append(base)
        return out


@dataclass
class Config:
    name: str
    forward_ms: float
    sampler_ms: float
    host_ms: float
    rows: dict[str, Row] = field(default_factory=dict)
    #: step_model.py's verdict for the overlap variant: "GPU-bound" or "host-bound"
    bound: str = ""


def parse(text: str) -> dict[str, Config]:
    """Every configuration block of a ``step_model.py`` results file's first run (a recorded file
    may hold later runs after it), rows by variant name."""
    configs: dict[str, Config] = {}
    current: Config | None = None
    for line in text.splitlines():
        m = _CONFIG.match(line)
        if m and m["name"] in configs:  # the next run begins
            break
        if m:
            host = float(m["prepare"]) + float(m["between"]) + float(m["save"])
            current = configs[m["name"]] = Config(m["name"], float(m["forward"]), float(m["sampler"]), host)
            continue
        if current is None or line.lstrip().startswith(("variant", "per-round")):
            continue
        verdict = re.match(r"^\s+-> (GPU-bound|host-bound):", line)
        if verdict:
            current.bound = verdict[1]
            continue
        m = _ROW25.match(line) or _ROW.match(line)
        if m:
            waits = [(w["site"], int(w["count"]), int(w["us"])) for w in _WAIT.finditer(m["waits"].split("[")[0])]
            name = RENAMED.get(m["name"], m["name"])
            current.rows[name] = Row(name, float(m["ms"]), float(m["p10"]), float(m["p90"]),
                                          float(m["ratio"]), float(m["waited"]), float(m["host"]), waits)
    if not configs:
        raise ParseError("no 'config NAME: forward ...' block found: is this a benchmarks/step_model.py results file?")
    for config in configs.values():
        missing = [name for name, _ in VARIANTS if name not in config.rows]
        if missing:
            raise ParseError(f"config {config.name}: no row for variant(s) {', '.join(missing)}")
        for row in config.rows.values():
            if abs(row.waited + row.host - row.ms) > 0.01:
                raise ParseError(f"config {config.name}, {row.name}: waited {row.waited} + host {row.host} "
                                 f"!= ms/step {row.ms}")
    return configs


def render(configs: dict[str, Config], output: str, source: str = "benchmarks/results/step_model.txt",
           gpu: str = "H100") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(configs)
    fig, axes = plt.subplots(len(names), 1, figsize=(10, 2.3 + 3.0 * len(names)), squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        config = configs[name]
        rows = [(config.rows[key], label) for key, label in VARIANTS]
        fd25 = [(config.rows[key], label) for key, label in FD25_VARIANTS if key in config.rows]
        if len(fd25) == len(FD25_VARIANTS):
            rows += fd25
        ys = list(range(len(rows)))[::-1]
        host = [r.host for r, _ in rows]
        waited = [r.waited for r, _ in rows]
        ax.barh(ys, host, color="#3b75af", label="host working")
        ax.barh(ys, waited, left=host, color="#f0a35e", label="host blocked in waits")
        for y, (row, _) in zip(ys, rows):
            ax.errorbar(row.ms, y, xerr=[[row.ms - row.p10], [row.p90 - row.ms]], fmt="none", ecolor="#333", capsize=2, lw=0.8)
            base = "FD 2.5" if row.name.startswith("fd25") else "FD 2.4"
            ax.text(row.p90 + 0.12, y, f"{row.ms:.2f} ms ({row.ratio:.3f}x {base})  waits: {' '.join(row.wait_sites)}",
                    va="center", fontsize=8)
        if len(rows) > len(VARIANTS):  # FD 2.5's rows below a line
            ax.axhline(ys[len(VARIANTS) - 1] - 0.5, color="#999", lw=0.6)
        floor = config.rows["gpu-only"].ms
        ax.axvline(floor, color="#555", ls="--", lw=0.8)
        ax.set_yticks(ys, [label for _, label in rows], fontsize=9)
        ax.set_xlim(0, max(r.p90 for r, _ in rows) * 1.8)
        ax.set_xlabel("ms per decode step (median; whiskers p10-p90)", fontsize=9)
        bound = f", overlap {config.bound}" if config.bound else ""
        ax.set_title(f"{name}: forward {config.forward_ms:.2f} + sampler {config.sampler_ms:.2f} ms GPU, "
                     f"{config.host_ms:.2f} ms host phases{bound}; dashed: GPU only", fontsize=10)
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"Modelled FD 2.4 and FD 2.5 decode steps on an {gpu} (spin kernels and busy-waits at FD's sites; "
                 f"not FastDeploy measurements)\nfrom {source}", fontsize=9)
    fig.tight_layout()
    fig.savefig(output, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", default=DEFAULT_INPUT, help="step_model.py results file")
    parser.add_argument("--output", default=DEFAULT_OUTPUT, help="PNG to write")
    args = parser.parse_args(argv)
    with open(args.input, encoding="utf-8") as f:
        try:
            configs = parse(f.read())
        except ParseError as exc:
            print(f"plot_step_model: {args.input}: {exc}", file=sys.stderr)
            return 2
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("plot_step_model: matplotlib is not installed: pip install '.[plot]' (or pip install matplotlib)",
              file=sys.stderr)
        return 2
    source = os.path.relpath(args.input, os.path.dirname(HERE)) if args.input.startswith(os.path.dirname(HERE)) else args.input
    with open(args.input, encoding="utf-8") as f:
        gpu = re.search(r"^framework .*?, NVIDIA (H\d+)", f.read(), re.M)
    render(configs, args.output, source, gpu[1] if gpu else "unnamed GPU")
    print(f"wrote {args.output} ({', '.join(configs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
