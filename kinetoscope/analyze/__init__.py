"""Analysis of Kineto traces, folders in the order the data flows (each imports only the ones before it):

``ingest`` (file -> ``Trace``) -> ``model`` (the ``Trace`` and the views several stages share) -> ``analyzers``
(pure ``(trace, config) -> AnalysisResult`` leaves, imported only by ``registry``) -> ``whatif`` (what a fix is
worth) -> ``report`` (all analyzers over a job into one ``Report``; compare two) -> ``views`` (what the app draws).
``crosscheck`` stands beside the pipeline. In imports, ``model`` sits below ``ingest`` (ingest builds the model);
``tests/unit/test_layers.py`` declares the order and checks it. Nothing here imports torch or changes process-wide
settings.
"""
