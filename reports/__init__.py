"""Reports: human tables, JSON and Chrome/Perfetto traces (plots come later)."""

from reports.text import format_result, verdict_line
from reports.trace import trace_events, write_trace

__all__ = ["format_result", "trace_events", "verdict_line", "write_trace"]
