"""Routing traces (docs/routing-trace.md): the reader and writer (trace.py) and the summary (summary.py)."""
from .trace import Record, Trace, read_trace, write_trace

__all__ = ["Record", "Trace", "read_trace", "write_trace"]
