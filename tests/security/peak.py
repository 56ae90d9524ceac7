"""The peak of Python allocations while a block runs (``ru_maxrss`` is a process-wide high-water mark,
so it cannot see a block's growth once an earlier test went higher)."""

from __future__ import annotations

import contextlib
import tracemalloc
from collections.abc import Iterator


@contextlib.contextmanager
def allocation_peak() -> Iterator[list[float]]:
    """Yields a list that holds, after the block, the peak in MB of what the block allocated."""
    result: list[float] = []
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        yield result
    finally:
        result.append((tracemalloc.get_traced_memory()[1] - base) / 1e6)
        if not was_tracing:
            tracemalloc.stop()
