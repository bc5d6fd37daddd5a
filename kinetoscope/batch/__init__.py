"""Batch analysis of many traces on Dask, into a Parquet store (``pip install 'kinetoscope[cluster]'``)."""

from kinetoscope.batch.discover import discover
from kinetoscope.batch.run import BatchSummary, run_batch

__all__ = ["BatchSummary", "discover", "run_batch"]
