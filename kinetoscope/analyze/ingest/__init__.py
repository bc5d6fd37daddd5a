"""Stage 1 of the pipeline, ingest: a file (or a directory of rank files) becomes a ``Trace``.

Takes paths and ``LoadLimits``; gives a ``model.trace.Trace``. Here and only here: finding a job's files
(``jobs``), opening and gunzipping them under the limits (``limits``, ``loader``), the streaming C scanner (``scan``,
``_scan.c``) and the reference msgspec decoder (``parser``) into flat columns (``raw``), the typed tables
(``build``), the Parquet cache (``cache``), the capture's sidecars, and redaction of a trace's bytes (``redact``).
Imports nothing above ``model``.
"""
