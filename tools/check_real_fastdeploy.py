#!/usr/bin/env python3
"""Check a real FastDeploy tree against this plugin: profile detection and replica fidelity.

The checks live in the ``real_fd`` package next to this script (see ``real_fd/__init__.py``).
Usage: ``python tools/check_real_fastdeploy.py --fd-src /path/to/FastDeploy [--json] [--strict]``.
"""

import sys

from real_fd.cli import main

if __name__ == "__main__":
    sys.exit(main())
