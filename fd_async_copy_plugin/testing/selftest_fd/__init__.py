"""``fd-async-copy selftest`` against the FastDeploy that is installed here.

- ``checks``: detection (the same as ``doctor``), FastDeploy's own ``Sampler.gather_logprobs`` /
  ``compute_logprobs`` / ``slice_rows`` / ``_get_prompt_logprobs_list`` before and after enabling
  the plugin (bit-identical, results still valid after later calls, the patched path asserted),
  FastDeploy's compiled stop-flag ops against the plugin's kernels, the Paddle accessor probe, and
  host time per call of the patched paths against FastDeploy's own. Needs Paddle.
- ``kernel_compare``: the framework-neutral core of the stop-flag comparison (numpy only), also
  used by ``benchmarks/selftest_kernel_compare.py`` on a GPU machine without Paddle.

Importing this package imports neither Paddle nor FastDeploy.
"""

from __future__ import annotations
