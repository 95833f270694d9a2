"""Serving traces as the industry writes them: read, check and analysed for reuse (issue 24).

Pure computation on the lowest floor: standard library and numpy only, nothing else of the project, no
Django. `formats` reads the public formats as they are (detected automatically, named in every message),
`reuse` counts the hits vLLM's prefix cache would get (unbounded and LRU at any capacity, one pass),
`reference` is the plain-Python statement of the same definitions (the tests' oracle and the benchmark's
baseline), `sample` chooses whole sessions for a replay, and `analysis` puts them together as the JSON of
`manage.py trace analyze`. docs/traces.md describes the formats, the counting and the session inference.
"""
from gates.traces.formats import FORMATS, Trace, TraceFormatError, detect_format, read_trace

__all__ = ["FORMATS", "Trace", "TraceFormatError", "detect_format", "read_trace"]
