"""``torchring bench``: collective and training benchmarks that launch their own ranks.

The launcher side (``cli``) parses flags and starts the ranks with ``torchring run``'s machinery; the
ranks run ``python -m torchring.bench.worker``, measure (``collectives``, ``train``), and rank 0
writes its results as JSON for the launcher to print (``report``) and save.
"""

from __future__ import annotations

from .cli import add_bench_arguments, run_bench

__all__ = ["add_bench_arguments", "run_bench"]
