"""Check a real FastDeploy tree against this plugin: profile detection and replica fidelity.

Usage::

    python tools/check_real_fastdeploy.py --fd-src /path/to/FastDeploy [--json] [--strict]
                                          [--replica auto|fd24|fd25|fddev|none|<dotted.module>]
                                          [--no-behaviour] [--keep-scratch]

``--fd-src`` is a FastDeploy source checkout (the folder that holds ``fastdeploy/``) or the
``fastdeploy`` package folder itself; without it the installed ``fastdeploy`` is used. The tool
never fetches FastDeploy: you point it at a tree you already have.

What it reports:

1. ``profile``: ``fd_async_copy_plugin.profile.detect_profile()`` (structural markers read from
   source), next to the same markers measured by importing FastDeploy, and the values that
   fastdeploy-surface.md §7 expects for the detected profile.
2. ``surface``: for each patch point (module relative to the root package + qualified name), the
   real FastDeploy against our replica (``fd_async_copy_plugin.testing.reference.fd24`` / ``.fd25``
   / ``.fddev``, by profile):
   existence and ``inspect.signature`` parameter names, kinds and defaults; dataclass and
   NamedTuple fields in order; the op names ``pre_and_post_process`` imports from ``ops.gpu``;
   the names the runners import from ``pre_and_post_process``; the ``share_inputs`` keys created
   at start-up with their dtype, shape and placement where the source states them.
3. ``census develop`` (``census_dev``, rows ``(dev)``): on a develop tree (``fastdeploy-2.6+``) and
   on the ``fddev`` replica, the code shape behind the ``fddev-*`` census rows (two host waits per
   plain decode step).
4. ``behaviour``: the state-free patch points (``Sampler.compute_logprobs``/``gather_logprobs``,
   ``LogprobsTensors`` helpers) run on both sides with the same small inputs, compared bitwise.

FastDeploy's own share_inputs keys and import lists are listed (``fd share_inputs``,
``fd imports``) even without a replica.

FastDeploy needs its compiled custom ops to import its GPU modules. When they are absent (a CPU
machine) the tool calls FastDeploy's own ``ops.gpu.tolerant_import_error()`` first, which turns
every op into ``None`` - enough for imports and signatures. A module that still fails to import is
listed, and read with ``ast`` instead, so every check still runs.

Statuses: OK, MISMATCH (both sides have it, they differ), MISSING (FastDeploy has it, the replica
does not), EXTRA (the replica has something FastDeploy lacks), INFO, SKIP. ``--strict`` exits 1
when any MISMATCH, MISSING or EXTRA is reported.

Modules, in the order a run uses them: ``common`` (patch points, the report model), ``environment``
(sys.path, stubbed ops, which modules imported), ``side`` (one tree seen through imports and AST),
``signatures`` and ``source`` (normalised descriptions, AST readers), then one module per section:
``profile_check`` (1), ``fidelity`` (2), ``census_dev`` (3), ``behaviour`` (4); ``cli`` renders and parses arguments.
"""
