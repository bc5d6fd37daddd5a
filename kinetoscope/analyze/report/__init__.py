"""Stage 5 of the pipeline, the report: every registered analyzer over a job, then one ``Report``.

Takes a ``Trace`` (from ``ingest``) and an ``AnalysisConfig``; gives a ``Report`` (``builder``): the analyses run
through the registry (scheduling over ranks and threads), every finding through the one severity policy
(``policy``) once its estimate (from ``whatif``) is known, the invariants checked; and two reports compared
(``compare``, ``steptime``), findings that share a saving (``savings``). Renderers (``kinetoscope.render``) and
views format what is here; nothing here formats for a screen.
"""
