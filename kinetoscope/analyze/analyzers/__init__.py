"""Built-in analyzers; importing this package registers them in report order."""

from kinetoscope.analyze.analyzers import steps, anatomy, loader, gpu, allocator, copies, memory, host, comm, telemetry, hygiene, outliers, coverage, straggler  # noqa: F401
