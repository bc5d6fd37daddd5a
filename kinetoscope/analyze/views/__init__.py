"""Stage 6 of the pipeline, the views: what the app draws, chosen here so screens never compute.

Takes a ``Trace``, a ``Report`` or two; gives tables and records for one page each: the timeline's spans at
screen resolution (``spans``), operators and kernels (``ops``), the GPU summary (``gpuinfo``), the Distributed page
(``distributed``) and the Compare page (``compare``). Computed on demand by the app, never by ``analyze``.
"""
