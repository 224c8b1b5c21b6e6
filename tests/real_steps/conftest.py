"""The real-steps check installs the sync check's step and op hooks (``check.counts``): every test
here starts and ends with the check off and its hooks removed."""

from __future__ import annotations

import pytest




@pytest.fixture(autouse=True)
def _sync_check_off(sync_check_off):
    """Every test here starts and ends with the check off (``tests/conftest.py``)."""
    yield
