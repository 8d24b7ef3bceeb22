"""The server's KV budget when ``--kv-budget`` is not given: half of the
memory the machine has left once the model is loaded.

Half, because the budget bounds the KV the engine and the pool keep
(docs/serve.md, "The KV budget"), not what a turn in flight needs on top of
it: the live lineages of the conversations being served, the logits, the
tokenizer's and the server's own allocations. A machine whose memory cannot
be read (no ``sysconf`` page counts) gets no bound, as before.
"""

from __future__ import annotations

import os
import resource
import sys


def get_physical_bytes() -> int | None:
    """The machine's physical memory in bytes, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def get_resident_bytes() -> int:
    """This process's resident memory now (Linux: ``/proc/self/statm``;
    elsewhere its peak so far, the closest the standard library reads)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # macOS counts bytes, Linux KiB


def compute_default_kv_budget(physical: int, resident: int) -> int:
    """Half of what ``physical`` bytes leave after ``resident`` (the loaded model and the process)."""
    return max(0, (physical - resident) // 2)


def get_default_kv_budget() -> int | None:
    """:func:`compute_default_kv_budget` on this machine, now (call it once the model is loaded)."""
    physical = get_physical_bytes()
    return None if physical is None else compute_default_kv_budget(physical, get_resident_bytes())


__all__ = ["compute_default_kv_budget", "get_default_kv_budget", "get_physical_bytes", "get_resident_bytes"]
