"""The ``FD_ASYNC_COPY*`` environment variables, parsed and validated in one place.

Bad values never reach the decode loop: ``AsyncCopyConfig.from_env`` raises ``ConfigError`` naming the
variable, the bad value and the allowed values, and the caller (``register()``) logs it and leaves
FastDeploy unpatched (or re-raises in strict mode).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping

#: The feature names are the installed patch sets' (``registry.catalog.feature_catalog()``: a
#: ``FeatureCatalog`` with ``default`` - what ``all`` stands for - and ``opt_in``); callers hand it in.
#: The shipped backends (``runtime.make_backend`` builds them). More are found by name in the
#: ``fd_async_copy.backends`` entry-point group (``registry.manager.backend_names``), loaded only
#: when asked for: that is how tests and ``selftest`` select their fake CUDA runtime.
BACKENDS = ("auto", "cuda", "host")

ENV_ENABLE, ENV_FEATURES, ENV_BACKEND, ENV_STRICT, ENV_RING_MAX_BYTES, ENV_OVERLAP_COUNT = ENV_VARS = (
    "FD_ASYNC_COPY", "FD_ASYNC_COPY_FEATURES", "FD_ASYNC_COPY_BACKEND", "FD_ASYNC_COPY_STRICT",
    "FD_ASYNC_COPY_RING_MAX_BYTES", "FD_ASYNC_COPY_OVERLAP_COUNT")
#: how ``overlap`` sizes the next step (``docs/overlap-token-count.md``): ``exact`` as ``bound``, then the
#: wait for the exact count at the forward's launch, a trim and FD 2.4's padding rows (else ``prepare``'s
#: wait: ``launch_off_reason``); ``prepare`` waits before the prepare; ``bound``: FD 2.5's padded upper
#: bound (after a finish padded GEMMs can change the real rows' bits); ``launch``: ``exact``'s old name
OVERLAP_COUNTS, OVERLAP_ALIASES = ("exact", "prepare", "bound"), {"launch": "exact"}

#: Default total size of the pinned rings of one feature (bytes); beyond it a step is copied
#: FastDeploy 2.4's blocking way instead of growing page-locked memory (issue 13).
DEFAULT_RING_MAX_BYTES = 1 << 30
_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
#: ASCII digits only: ``str.isdigit()`` and ``int()`` also take superscripts, circled and
#: Arabic-Indic digits ("²", "①", "١٢٣"), which are typos here, not sizes.
_SIZE = re.compile(r"([0-9]+)([KMG]?)(?:I?B)?", re.ASCII)

_BOOL = {"1": True, "0": False}


class ConfigError(ValueError):
    """Invalid settings; the message names each bad variable, its value and what is allowed
    (``problems`` lists them one by one)."""

    def __init__(self, message: str, problems: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems or (message,)


def _bool(name: str, raw: str | None) -> bool:
    value = (raw or "0").strip()  # unset or empty: off
    if value not in _BOOL:
        raise ConfigError(f"{name}={raw!r} is not valid; allowed values: 1 (on) or 0 (off)")
    return _BOOL[value]


def parse_features(raw: str | None, source: str = ENV_FEATURES, catalog=None) -> tuple[str, ...]:
    """``all`` (or unset) -> every feature of ``catalog`` but the opt-in ones; otherwise a comma list
    of its names, where ``all`` stands for those (``all,overlap``). Without a catalog (the patch sets
    not asked yet) the names are kept as given, ``all`` among them, for ``enable()`` to check."""
    names = ["all"] if raw is None or raw.strip() == "" else [part.strip() for part in raw.split(",") if part.strip()]
    if catalog is None:
        if not names:
            raise ConfigError(f"{source}={raw!r} is not valid: it names no feature")
        return tuple(dict.fromkeys(names))
    unknown = [n for n in names if n not in catalog.names and n != "all"]
    if unknown or not names:
        opt_in = f" (opt-in, not in 'all': {', '.join(catalog.opt_in)})" if catalog.opt_in else ""
        raise ConfigError(
            f"{source}={raw!r} is not valid: unknown feature(s) {unknown or [raw]}; allowed: 'all' or a "
            f"comma list of {', '.join(catalog.names) or '(no patch set installed)'}{opt_in}")
    expanded = [f for n in names for f in (catalog.default if n == "all" else (n,))]
    return tuple(dict.fromkeys(expanded))  # de-duplicated, in the order given


def parse_backend(raw: str | None, source: str = ENV_BACKEND, allowed=BACKENDS) -> str:
    value = (raw or "auto").strip()
    if value not in allowed:
        raise ConfigError(f"{source}={raw!r} is not valid; allowed values: {', '.join(allowed)}")
    return value


def parse_ring_max_bytes(raw: str | None, source: str = ENV_RING_MAX_BYTES) -> int:
    """A positive byte count, optionally with a K, M or G suffix (binary); unset -> the default."""
    if raw is None or raw.strip() == "":
        return DEFAULT_RING_MAX_BYTES
    match = _SIZE.fullmatch(raw.strip().upper()) if raw.isascii() else None
    if match is None or int(match.group(1)) <= 0:
        raise ConfigError(
            f"{source}={raw!r} is not valid; allowed values: a positive number of bytes, optionally with "
            f"a K, M or G suffix (e.g. 268435456 or 256M; default {DEFAULT_RING_MAX_BYTES >> 20}M)")
    return int(match.group(1)) * _SIZE_SUFFIXES[match.group(2)]


def parse_overlap_count(raw: str | None, source: str = ENV_OVERLAP_COUNT) -> str:
    value = OVERLAP_ALIASES.get(value := (raw or "exact").strip(), value)
    if value not in OVERLAP_COUNTS:
        raise ConfigError(f"{source}={raw!r} is not valid; allowed values: exact (default: bit-identical to "
                          "FastDeploy 2.4, the wait at the forward's launch), prepare (the wait before the "
                          "prepare) or bound (FastDeploy 2.5's padded upper bound: faster, see the README)")
    return value


@dataclass(frozen=True)
class RunSettings:
    """The settings the patches read (``PatchContext.settings``): validated once, by ``enable()``
    from its arguments or by ``register()`` from the environment; no patch reads ``os.environ``."""

    ring_max_bytes: int = DEFAULT_RING_MAX_BYTES
    overlap_count: str = "exact"

    @classmethod
    def parse(cls, ring_max_bytes=None, overlap_count=None, environ: Mapping[str, str] | None = None) -> "RunSettings":
        """From ``enable()``'s arguments; an argument left None takes its environment variable (or
        the default). Raises ``ConfigError`` naming what was given: the argument or the variable."""
        environ = os.environ if environ is None else environ
        ring = (parse_ring_max_bytes(environ.get(ENV_RING_MAX_BYTES)) if ring_max_bytes is None
                else parse_ring_max_bytes(str(ring_max_bytes), source="ring_max_bytes"))  # True: invalid
        count = (parse_overlap_count(environ.get(ENV_OVERLAP_COUNT)) if overlap_count is None
                 else parse_overlap_count(overlap_count, source="overlap_count"))
        return cls(ring_max_bytes=ring, overlap_count=count)


@dataclass(frozen=True)
class AsyncCopyConfig:
    enabled: bool = False
    features: tuple[str, ...] = ("all",)
    backend: str = "auto"
    strict: bool = False
    ring_max_bytes: int = DEFAULT_RING_MAX_BYTES
    overlap_count: str = "exact"

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, catalog=None) -> "AsyncCopyConfig":
        """``catalog``: the installed feature names (``registry.catalog.feature_catalog()``); without
        it the feature names are checked by ``enable()``."""
        env = (os.environ if environ is None else environ).get
        parsers = {"enabled": lambda: _bool(ENV_ENABLE, env(ENV_ENABLE)),
                   "features": lambda: parse_features(env(ENV_FEATURES), catalog=catalog),
                   "backend": lambda: parse_backend(env(ENV_BACKEND)),
                   "strict": lambda: _bool(ENV_STRICT, env(ENV_STRICT)),
                   "ring_max_bytes": lambda: parse_ring_max_bytes(env(ENV_RING_MAX_BYTES)),
                   "overlap_count": lambda: parse_overlap_count(env(ENV_OVERLAP_COUNT))}
        values, problems = {}, []
        for key, parse in parsers.items():  # every bad variable is reported, not only the first
            try:
                values[key] = parse()
            except ConfigError as exc:
                problems.append(str(exc))
            except Exception as exc:  # a parser bug must still name the variable, never escape
                problems.append(f"cannot parse the value for {key}: {type(exc).__name__}: {exc}")
        if problems:
            raise ConfigError("; ".join(problems), tuple(problems))
        return cls(**values)


def strict_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Strict mode, read on its own so a bad value elsewhere can still honour it (an invalid value of
    its own: off)."""
    return ((os.environ if environ is None else environ).get(ENV_STRICT) or "").strip() == "1"
