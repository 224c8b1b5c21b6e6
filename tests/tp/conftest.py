"""Tensor-parallel tests: a hang anywhere fails the test with every thread's stack.

``run_decode_tp`` turns a rank waiting at a collective (or a loop iteration that does not end) into
``RankHang`` with every rank's stack after its ``timeout``; this folder's backstop dumps every
thread's stack and ends the process if a test outlives ``DEADLINE_S`` all the same (a hang outside
the ranks' loops)."""

import faulthandler
import sys

import pytest

DEADLINE_S = 120


@pytest.fixture(autouse=True)
def _deadline():
    faulthandler.dump_traceback_later(DEADLINE_S, exit=True, file=sys.stderr)
    yield
    faulthandler.cancel_dump_traceback_later()
