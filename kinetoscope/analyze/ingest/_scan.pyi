# Types of the compiled scanner (_scan.c), for the type checker only.
from typing import Any

class Scanner:
    #: events scanned
    n: int
    #: whether the next byte must start an item of traceEvents
    at_item: bool
    #: why the scanner gave up, or None
    reason: str | None
    def __init__(self, max_depth: int = ..., resume: int = ...) -> None: ...
    def feed(self, data: bytes | bytearray | memoryview, final: bool, /) -> int:
        """Bytes consumed, or -1 when the document needs the reference decoder."""
    def finish(self) -> Any:
        """The columns, tables and metadata scanned so far."""
