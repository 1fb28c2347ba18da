"""The benchmarks' one failure type."""

from __future__ import annotations


class BenchError(Exception):
    """A benchmark could not measure what it set out to; the message is one line for the user."""
