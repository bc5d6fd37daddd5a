"""Batch analysis of many traces on Dask, into a Parquet store (``pip install 'kinetoscope[cluster]'``).

Names are imported on first use, so ``kinetoscope --help`` (which registers the batch commands)
never loads pandas, pyarrow or Dask.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatchSummary", "discover", "run_batch"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(name)
    from kinetoscope.batch.discover import discover
    from kinetoscope.batch.run import BatchSummary, run_batch

    # bind the functions over the submodule of the same name (``discover``), as an eager import would
    globals().update(discover=discover, BatchSummary=BatchSummary, run_batch=run_batch)
    return globals()[name]
