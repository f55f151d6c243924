"""The package graph keeps the design's layering and has no import cycles (read from the source, not run).

Every ``import`` and ``from ... import`` in every module of our packages is an edge, wherever it stands
(module level, inside a function, under ``if TYPE_CHECKING``): a lazy import is a dependency all the
same, and a cycle through one is a cycle a reader has to untangle. ``from a.b import c`` is an edge to
the module ``a.b.c`` when that file exists, else to the module ``a.b``'s ``__init__`` takes ``c`` from
(so ``from simulator import simulate_plan`` is an edge to ``simulator.simulate``), else to ``a.b``. A
package is reached through its ``__init__`` only when it is named (no implicit edges to parent packages).

The rules (design: a package imports only packages left of / above it in the picture):

- no import cycle among the modules of ``tiersim/`` or of ``reports/``;
- ``userfiles`` (the one reader of user files) imports none of our packages, and every package may import it;
- ``hardware_models`` and ``workloads`` import none of our packages but ``userfiles``; ``costs`` imports only
  those three (and no SimPy);
- ``simulator`` imports no ``policies``, ``planner``, ``reports``, ``replay`` or ``tiersim``;
- ``policies`` imports no ``planner``, ``reports``, ``replay`` or ``tiersim``, and from ``simulator`` only
  the plan vocabulary (``simulator``, ``simulator.plan``, ``simulator.plan_workload``, ``simulator.phase``,
  ``simulator.errors``, ``simulator.rank_template``);
- ``planner`` imports no ``reports``, ``replay`` or ``tiersim``; ``reports`` no ``replay`` or ``tiersim``;
- ``replay`` imports no ``planner`` or ``tiersim``;
- only ``replay`` imports ``torch`` at module level (torch is an optional extra for everything else).

A package that does not exist (yet) has no edges and breaks no rule. Each failure prints every offending
edge as ``file:line  importer -> imported``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("userfiles", "hardware_models", "workloads", "costs", "policies", "simulator", "planner", "reports",
            "replay", "tiersim")
PLAN_VOCABULARY = frozenset({"simulator", "simulator.plan", "simulator.plan_workload", "simulator.phase",
                             "simulator.errors", "simulator.rank_template"})
# importer package -> our packages it must not import
FORBIDDEN: dict[str, frozenset[str]] = {
    "userfiles": frozenset(PACKAGES) - {"userfiles"},  # the one reader of user files: the bottom of the house
    "hardware_models": frozenset(PACKAGES) - {"hardware_models", "userfiles"},
    "workloads": frozenset(PACKAGES) - {"workloads", "userfiles"},
    "costs": frozenset(PACKAGES) - {"costs", "hardware_models", "workloads", "userfiles"},
    "simulator": frozenset({"policies", "planner", "reports", "replay", "tiersim"}),
    "policies": frozenset({"planner", "reports", "replay", "tiersim"}),
    "planner": frozenset({"reports", "replay", "tiersim"}),
    "reports": frozenset({"replay", "tiersim"}),
    "replay": frozenset({"planner", "tiersim"}),
}
THIRD_PARTY_FORBIDDEN = {"costs": frozenset({"simpy"})}  # pure pricing: no event engine
CYCLE_FREE = ("tiersim", "reports")


@dataclass(frozen=True)
class Edge:
    importer: str      # dotted module name, e.g. "tiersim.cli"
    imported: str      # dotted name as resolved: one of our modules, or the first name of a third-party one
    file: str          # path relative to the repository root
    line: int
    module_level: bool  # runs on import (not inside a function, nor under `if TYPE_CHECKING`)

    def __str__(self) -> str:
        return f"{self.file}:{self.line}  {self.importer} -> {self.imported}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def our_modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        if (ROOT / pkg / "__init__.py").is_file():
            out.update((module_name(p), p) for p in sorted((ROOT / pkg).rglob("*.py")))
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement with whether it runs when the module is imported."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, module_level))
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            module_level = False
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, module_level)
            return
        for child in ast.iter_child_nodes(node):
            visit(child, module_level)

    visit(tree, True)
    return found


def _base(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    base = node.module or ""
    if node.level:
        anchor = importer.split(".") if is_package else importer.split(".")[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    return base


def _reexports(modules: dict[str, Path], trees: dict[str, ast.Module]) -> dict[tuple[str, str], str]:
    """(package, name) -> the module a package's ``__init__`` takes ``name`` from (``from m import name``)."""
    out: dict[tuple[str, str], str] = {}
    for pkg, path in modules.items():
        if path.name != "__init__.py":
            continue
        for node in trees[pkg].body:
            if isinstance(node, ast.ImportFrom):
                src = _base(pkg, True, node)
                for a in node.names:
                    out[(pkg, a.asname or a.name)] = f"{src}.{a.name}" if f"{src}.{a.name}" in modules else src
    return out


def _resolve(importer: str, is_package: bool, node: ast.Import | ast.ImportFrom, modules: dict[str, Path],
             reexports: dict[tuple[str, str], str]) -> list[str]:
    """The modules an import statement reaches: a name a package re-exports counts as its defining module
    (``from simulator import simulate_plan`` is an edge to ``simulator.simulate``)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _base(importer, is_package, node)
    out = []
    for a in node.names:
        sub = f"{base}.{a.name}"
        out.append(sub if sub in modules else reexports.get((base, a.name), base))
    return out


def build_graph() -> list[Edge]:
    modules = our_modules()
    trees = {name: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for name, path in modules.items()}
    reexports = _reexports(modules, trees)
    edges: set[Edge] = set()
    for name, path in modules.items():
        rel = str(path.relative_to(ROOT))
        for node, module_level in _imports(trees[name]):
            for target in _resolve(name, path.name == "__init__.py", node, modules, reexports):
                edges.add(Edge(name, target, rel, node.lineno, module_level))
    return sorted(edges, key=lambda e: (e.file, e.line, e.imported))


def package_of(module: str) -> str:
    return module.split(".")[0]


def cycles(edges: list[Edge], package: str) -> list[list[Edge]]:
    """The strongly connected components (of more than one module, or a module importing itself) of
    ``package``'s own import graph, each as the edges inside it."""
    inside = [e for e in edges if package_of(e.importer) == package and package_of(e.imported) == package]
    succ: dict[str, set[str]] = {}
    for e in inside:
        succ.setdefault(e.importer, set()).add(e.imported)
        succ.setdefault(e.imported, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(succ[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in succ[v]:
                components.append(comp)

    for v in sorted(succ):
        if v not in index:
            connect(v)
    return [[e for e in inside if e.importer in c and e.imported in c] for c in components]


def layering_violations(edges: list[Edge]) -> list[Edge]:
    bad = []
    for e in edges:
        src, dst = package_of(e.importer), package_of(e.imported)
        beyond_vocabulary = src == "policies" and dst == "simulator" and e.imported not in PLAN_VOCABULARY
        if dst in FORBIDDEN.get(src, frozenset()) | THIRD_PARTY_FORBIDDEN.get(src, frozenset()) or beyond_vocabulary:
            bad.append(e)
    return bad


def torch_outside_replay(edges: list[Edge]) -> list[Edge]:
    return [e for e in edges if package_of(e.imported) == "torch" and e.module_level
            and package_of(e.importer) != "replay"]


def _report(edges: list[Edge]) -> str:
    return "\n".join(f"  {e}" for e in edges)


@pytest.fixture(scope="module")
def graph() -> list[Edge]:
    return build_graph()


@pytest.mark.parametrize("package", CYCLE_FREE)
def test_no_import_cycle(graph: list[Edge], package: str) -> None:
    found = cycles(graph, package)
    text = "\n".join(f"cycle of {len({e.importer for e in c})} modules:\n{_report(c)}" for c in found)
    assert not found, f"import cycles in {package}/:\n{text}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layering(graph: list[Edge], package: str) -> None:
    bad = [e for e in layering_violations(graph) if package_of(e.importer) == package]
    assert not bad, f"{package}/ imports what the layering forbids:\n{_report(bad)}"


def test_only_replay_imports_torch_at_module_level(graph: list[Edge]) -> None:
    bad = torch_outside_replay(graph)
    assert not bad, f"torch imported at module level outside replay/:\n{_report(bad)}"


# ------------------------------------------------------------------- the checker itself


def _graph_of(tmp: Path, files: dict[str, str]) -> list[Edge]:
    """build_graph over a made-up tree in ``tmp`` (the caller points ROOT at it)."""
    for rel, text in files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return build_graph()


def test_checker_sees_lazy_relative_and_type_checking_imports(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    edges = _graph_of(tmp_path, {
        "reports/__init__.py": "",
        "reports/build.py": "def f():\n    from reports.html import write\n",
        "reports/html.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .build import X\n",
        "reports/text.py": "import torch\n",
        "reports/lazy.py": "def f():\n    import torch\n",
        "replay/__init__.py": "import torch\n",
        "policies/__init__.py": "from simulator import Plan\nfrom simulator.engine import price\n"
                                "from simulator import simulate_plan\n",
        "simulator/__init__.py": "from simulator.plan import Plan\nfrom simulator.simulate import simulate_plan\n",
        "simulator/engine.py": "", "simulator/plan.py": "", "simulator/simulate.py": "",
        "costs/__init__.py": "import simpy\nfrom workloads import x\n", "workloads/__init__.py": "",
    })
    found = cycles(edges, "reports")
    assert len(found) == 1 and {e.importer for e in found[0]} == {"reports.build", "reports.html"}
    by = {(e.importer, e.imported): e for e in edges}
    assert by[("reports.html", "reports.build")].module_level is False
    assert [str(e) for e in layering_violations(edges)] == ["costs/__init__.py:1  costs -> simpy",
                                                          "policies/__init__.py:2  policies -> simulator.engine",
                                                          "policies/__init__.py:3  policies -> simulator.simulate"]
    assert [e.importer for e in torch_outside_replay(edges)] == ["reports.text"]
