"""Moved to ``harness.procs``, where tests find it without importing the
benchmark package. These names stay here only for the modules that still
import them from ``bench.procs`` (tests/dra/test_simulate.py and
bench/dra_publish.py); remove this file once they import ``harness.procs``."""

from harness.procs import Proc, free_port, wait_http

__all__ = ["Proc", "free_port", "wait_http"]
