"""Each layer of the package imports only from the layers below it (docs/layout.md).

Every `import` and `from ... import` in cipr/ is read with `ast`, including those inside functions
(a deferred import is still a dependency), and mapped to its unit: a top-level module (`cipr/core/io.py`
is `io`) or a subpackage (`cipr/train/` is `train`). A unit may import its own layer and the layers
below; an import of a higher layer is a back-edge and fails with the file, the line and both layers.
Two units of one layer may not import each other (a cycle between subpackages), nor may modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cipr"
PACKAGES = {"cipr"} | {f"cipr.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}

LAYERS: list[tuple[str, set[str]]] = [  # bottom first
    ("core", {"cipr", "core"}),
    ("tools", {"tools"}),
    ("formats", {"formats", "envs"}),
    ("data", {"data", "scoring"}),
    ("perturb", {"perturb"}),
    ("method", {"method"}),
    ("ops", {"ops"}),
    ("runtime", {"runtime"}),
    ("distill", {"distill"}),
    ("train", {"train"}),
    ("guard", {"guard"}),
    ("eval", {"eval"}),
    ("serve", {"serve"}),
    ("harness", {"tau2"}),
    ("experiments", {"experiments", "plan"}),
    ("cli", {"cli"}),
]
LEVEL = {unit: i for i, (_, units) in enumerate(LAYERS) for unit in units}

PENDING: dict[tuple[str, str], str] = {
    # back-edges in modules under active change elsewhere; each entry names what should move
}


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "cipr"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, imported cipr module) for every import in `path` (or `source`, read as that file), at any
    depth."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1]
                                  + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from cipr.core import io`, `from . import base`: modules
            if target in PACKAGES or node.module is None:
                found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return [(line, name) for line, name in found if name == "cipr" or name.startswith("cipr.")]


def _files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_unit_has_a_layer():
    units = {_unit(_module(p)) for p in _files()}
    assert not units - set(LEVEL), \
        f"add these to a layer in tests/test_layering.py and docs/layout.md: {units - set(LEVEL)}"


def _back_edges(files: list[tuple[Path, str | None]]) -> tuple[list[str], set[tuple[str, str]]]:
    """The back-edges among `files` (path, source or None to read it), and the PENDING ones seen."""
    back_edges, pending_seen = [], set()
    for path, source in files:
        rel = path.relative_to(PACKAGE).as_posix()
        here = _unit(_module(path))
        for line, target in _imports(path, source):
            there = _unit(target)
            if LEVEL.get(there, -1) <= LEVEL[here]:
                continue
            key = (rel, target.removeprefix("cipr."))
            if key in PENDING:
                pending_seen.add(key)
                continue
            back_edges.append(f"cipr/{rel}:{line} imports {target}: layer '{LAYERS[LEVEL[here]][0]}' may not "
                              f"import layer '{LAYERS[LEVEL[there]][0]}' above it")
    return back_edges, pending_seen


def test_layers_import_only_downward():
    back_edges, pending_seen = _back_edges([(p, None) for p in _files()])
    assert not back_edges, "\n".join(back_edges)
    gone = set(PENDING) - pending_seen
    assert not gone, \
        f"these back-edges are gone: remove them from PENDING in tests/test_layering.py: {sorted(gone)}"


def test_a_back_edge_is_named_with_its_file_line_and_layers():
    source = "import json\n\ndef load():\n    from cipr.train.run import run\n"
    back_edges, _ = _back_edges([(PACKAGE / "data" / "probe.py", source)])
    assert back_edges == \
        ["cipr/data/probe.py:4 imports cipr.train.run: layer 'data' may not import layer 'train' " "above it"]


@pytest.mark.parametrize("source, expected", [
    ("from cipr.train.run import run\n", ["cipr.train.run"]),
    ("def f():\n    import cipr.eval.config\n", ["cipr.eval.config"]),
    ("from cipr.core import io\n", ["cipr.core.io"]),
    ("from . import base\n", ["cipr.formats.base"]),
])
def test_imports_are_read_at_any_depth(source, expected):
    assert [name for _, name in _imports(PACKAGE / "formats" / "probe.py", source)] == expected


def _module_graph(files: list[tuple[Path, str | None]]) -> dict[str, set[str]]:
    modules = {_module(p) for p, _ in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for path, source in files:
        here = _module(path)
        for _, target in _imports(path, source):
            while target not in modules and "." in target:  # `from cipr.core.io import x` -> cipr.core.io
                target = target.rpartition(".")[0]
            if target in modules and target != here and not (path.name == "__init__.py" and
                                                             target.startswith(here + ".")):
                graph[here].add(target)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles_deferred_imports_included():
    cycles = _cycles(_module_graph([(p, None) for p in _files()]))
    assert not cycles, \
        "import cycles (deferred imports count):\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_a_deferred_back_edge_is_a_cycle():
    files = [(PACKAGE / "eval" / "report.py",
              "def f():\n    from cipr.eval.consistency_metric import attach\n"),
             (PACKAGE / "eval" / "consistency_metric.py", "from cipr.eval.report import table\n"),
             (PACKAGE / "eval" / "stats.py", "import math\n")]
    assert _cycles(_module_graph(files)) == [["cipr.eval.consistency_metric", "cipr.eval.report"]]


def _unit_graph(files: list[tuple[Path, str | None]]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path, source in files:
        here = _unit(_module(path))
        graph.setdefault(here, set())
        for _, target in _imports(path, source):
            there = _unit(target)
            if there != here and there != "cipr" and here != "cipr":
                graph[here].add(there)
                graph.setdefault(there, set())
    return graph


def test_no_cycle_between_subpackages_of_one_layer():
    cycles = _cycles(_unit_graph([(p, None) for p in _files()]))
    assert not cycles, "subpackages that import each other (deferred imports count):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_a_cycle_between_two_units_of_one_layer_is_found():
    files = [(PACKAGE / "data" / "a.py", "def f():\n    from cipr.scoring.b import g\n"),
             (PACKAGE / "scoring" / "b.py", "from cipr.data.a import f\n")]
    assert _cycles(_unit_graph(files)) == [["data", "scoring"]]
    assert not _back_edges(files)[0]  # one layer: the layer rule alone would let it pass


def test_the_root_holds_few_modules():
    modules = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(modules) <= 8, f"cipr/ holds {modules}: group them into the layer subpackages"
