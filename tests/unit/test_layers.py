"""The package's import graph, read from the source (ast): no cycle, and no import that climbs back up the pipeline.

Every import counts, at module level or inside a function (a lazy import is still a dependency), except those under
``if TYPE_CHECKING:`` (annotations only, never run). The layers are declared once, here, lowest first; a module may
import its own layer or a lower one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "kinetoscope"

#: lowest first; a module belongs to the layer of the longest prefix that names it
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("kinetoscope", "kinetoscope.errors", "kinetoscope.fsutil", "kinetoscope.deps",
              "kinetoscope.manifest", "kinetoscope.hangdump")),
    # the model is what ingest builds (the Trace, its schema, the views built with it): below ingest
    ("model", ("kinetoscope.analyze", "kinetoscope.analyze.model")),
    ("ingest", ("kinetoscope.analyze.ingest",)),
    ("analyzers", ("kinetoscope.analyze.analyzers",)),
    ("registry", ("kinetoscope.analyze.registry",)),
    ("whatif", ("kinetoscope.analyze.whatif",)),
    ("report", ("kinetoscope.analyze.report",)),
    ("crosscheck", ("kinetoscope.analyze.crosscheck",)),
    ("render", ("kinetoscope.render",)),
    ("views", ("kinetoscope.analyze.views",)),
    ("entry points", ("kinetoscope.app", "kinetoscope.batch", "kinetoscope.capture", "kinetoscope.cli",
                      "kinetoscope.__main__")),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_site" not in p.parts}


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "kinetoscope")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_package else name.split(".")[:-1]
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            if base.split(".")[0] != "kinetoscope":
                continue
            for alias in node.names:  # `from pkg import module` depends on the module, else on pkg
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


@functools.lru_cache(maxsize=1)
def _graph() -> dict[str, set[str]]:
    """Every module's imports, read once for the tests below (none changes it)."""
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    best, best_len = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = i, len(prefix)
    return best


def test_every_module_has_a_layer():
    assert [m for m in _modules() if _layer(m) < 0] == []


def test_no_import_climbs_back_up():
    climbing = sorted(f"{a} ({LAYERS[_layer(a)][0]}) imports {b} ({LAYERS[_layer(b)][0]})"
                      for a, deps in _graph().items() for b in deps if _layer(b) > _layer(a))
    assert climbing == []


def test_only_the_registry_imports_the_analyzers():
    importers = sorted(f"{a} imports {b}" for a, deps in _graph().items() for b in deps
                       if b.startswith("kinetoscope.analyze.analyzers.") and a != "kinetoscope.analyze.registry"
                       and not a.startswith("kinetoscope.analyze.analyzers"))
    assert importers == []


def test_analyzers_do_not_import_each_other():
    among = sorted(f"{a} imports {b}" for a, deps in _graph().items() for b in deps
                   if a.startswith("kinetoscope.analyze.analyzers.") and b.startswith("kinetoscope.analyze.analyzers."))
    assert among == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    assert _cycles(_graph()) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
])
def test_the_cycle_finder_finds_a_cycle(graph, expected):
    assert _cycles(graph) == expected


def test_the_layer_check_sees_a_climbing_import():
    assert _layer("kinetoscope.analyze.model.trace") < _layer("kinetoscope.analyze.analyzers.gpu")
    assert _layer("kinetoscope.analyze.model.trace") < _layer("kinetoscope.analyze.ingest.loader")
    assert _layer("kinetoscope.analyze.registry") < _layer("kinetoscope.analyze.whatif.replay")
