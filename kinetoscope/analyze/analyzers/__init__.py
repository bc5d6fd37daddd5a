"""Stage 3 of the pipeline, the analyzers: the leaves.

Each module is one analysis, a pure function ``(trace, config) -> AnalysisResult`` marked with
``model.analysis.register``. Takes a ``RankTrace`` (or the job's ``Trace``) and an ``AnalysisConfig``; gives
metrics, tables and findings. An analyzer imports only ``model``; only ``kinetoscope.analyze.registry`` imports the
analyzers (a view two of them need lives in ``model``).
"""
