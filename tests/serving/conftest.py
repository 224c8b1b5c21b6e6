"""Fixtures for the serving tests: loopback fake OpenAI-compatible servers that stop by themselves."""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # fake_openai_server sits next to the tests, not in the package
    sys.path.insert(0, str(HERE))

from fake_openai_server import FakeOpenAIServer  # noqa: E402


@pytest.fixture
def fake_servers():
    """``start(**options) -> FakeOpenAIServer``; every server started is shut down after the test."""
    with contextlib.ExitStack() as stack:
        yield lambda **options: stack.enter_context(FakeOpenAIServer(**options))


@pytest.fixture
def run_ab_cli():
    """Run ``fd-async-copy ab ARGS`` through the subcommand's own parser; returns the exit code."""
    from fd_async_copy_plugin.cli import ab

    def run(*argv: str) -> int:
        parser = argparse.ArgumentParser(prog="fd-async-copy")
        ab.add_parser(parser.add_subparsers(dest="command", required=True))
        return ab.run(parser.parse_args(["ab", *argv]))

    return run
