"""Stage 2 of the pipeline, the model every later stage shares: the ``Trace`` and its views.

Takes nothing from above; gives the ``Trace``/``RankTrace`` (``trace``, columns declared in ``schema``), interval
arithmetic (``intervals``), units at the report edge (``units``), the derived views of a rank that more than one
layer needs (``timeline``, ``phases``, ``collectives``, ``copies``, ``syncs``), ``Finding`` and its ``Estimate``
(``findings``, ``estimate``), what an analyzer is (``analysis``) and gives (typed records: ``record``,
``results``), the thresholds (``config``) and the cross-rank collective matching (``distributed``). Imports only
the standard library, numpy, pandas, msgspec and ``kinetoscope.errors``; in imports it sits below ``ingest``, which
builds it.
"""
