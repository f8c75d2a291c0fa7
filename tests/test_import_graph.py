"""The package-level import graph of ``dprec_torch`` has no cycle and runs downward.

A *unit* is a first-level subpackage or module of ``dprec_torch`` (``privacy/``, ``config.py``, ...). Every
``import``/``from ... import`` in ``dprec_torch/`` -- at module level or inside a function, absolute or relative --
gives an edge from the importing unit to the imported one. Imports under ``if TYPE_CHECKING:`` are left out: they
never run (annotations only). Hydra ``_target_`` strings are not imports either.

:data:`LAYERS` lists the units bottom to top; a unit may import only units on lower layers. Each layer, low to high:

0. ``key_feed``: the secret keys fed to a step replayed from a CUDA graph (imports no package unit);
0b. ``chacha_triton``, ``chacha_numba``: the CSPRNG's GPU (Triton) and CPU (numba) kernels (``chacha`` imports them);
1. ``errors``: the two exception types every layer raises; ``chacha``: the CSPRNG's kernels; ``populations``: whose
   people a data config holds; ``config_domains``: the config's value domains; ``cuda_driver``: the CUDA driver's
   first calls off the GIL (none imports a package unit);
2. plumbing with no domain knowledge: ``io`` (atomic writes), ``seeding``, ``device``, ``config`` (Hydra glue,
   schema check), ``sweep_cache``, ``startup``;
3. ``data``: ratings, folds, readers;
4. ``interfaces``: the Protocols (what a model, predictor, mechanism IS), so models and mechanisms look them up
   from below;
5. ``models``: the trainable ``nn.Module``s (PNBM, MF) and their batching/pair kernels;
6. ``privacy``: privacy math only -- accountants, budgets, sensitivity formulas, scope, ledger (``pnbm_clipping``
   reads ``models.batching``);
7. ``predictors``: fitted predictors (kNN, Slope One, PNCF, ...);
8. ``mechanisms``: training optimizers and output mechanisms (they privatise models and predictors);
9. ``privacy_harness``: the sensitivity harness, whose cases build real mechanisms, models and predictors;
10. ``evaluation``: metrics, cross-validation, the non-private baselines;
11. ``training``: the runners behind ``train.py`` and ``evaluate.py`` (checkpoints, trainer);
12. ``study``, ``audit``, ``attacks``: what is built on finished runs (two-stage study and its report, empirical
    privacy audits, the LIA attack); ``cli``: the command line's one-line check;
13. ``api``: the notebook surface (``dprec_torch.train``/``load_run``).

Target: no cycle, at most :data:`MAX_UPWARD` import running back up (a same-layer import counts).
A new unit must be added to :data:`LAYERS`, or this test fails.

The same rules hold between MODULES (:func:`module_import_edges`): no cycle even inside one unit (the
unit graph drops same-unit edges, so ``privacy_harness.registry`` <-> its case modules and ``mechanisms.base`` <->
``mechanisms.context`` went unseen), and at most :data:`MAX_UPWARD` import STATEMENT running back up the layers.
Function-level imports count there too (see :func:`module_import_edges` for why).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "dprec_torch"

LAYERS: list[set[str]] = [
    {"key_feed"},
    {"chacha_triton", "chacha_numba"},
    {"errors", "chacha", "populations", "config_domains", "forms", "cuda_driver"},
    {"io", "seeding", "device", "config", "sweep_cache", "startup"},
    {"data"},
    {"interfaces"},
    {"models"},
    {"privacy"},
    {"predictors"},
    {"mechanisms"},
    {"privacy_harness"},
    {"evaluation"},
    {"training"},
    {"study", "audit", "attacks", "cli"},
    {"api"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
MAX_UPWARD = 1


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST):
    """Every Import/ImportFrom node, at any depth, except those under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif _lazy_import_of(node) is not None:  # lazy_import("dprec_torch.x"): an import whose body runs later
            yield ast.Import(names=[ast.alias(name=_lazy_import_of(node))], lineno=node.lineno)
        stack.extend(ast.iter_child_nodes(node))


def _lazy_import_of(node: ast.AST) -> str | None:
    """The module named by a ``lazy_import("...")`` call (:func:`dprec_torch.startup.lazy_import`), else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    return node.args[0].value if name == "lazy_import" and isinstance(node.args[0].value, str) else None


def _unit(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == PACKAGE and len(parts) > 1 else None


def _imported(node: ast.AST, package_parts: list[str]) -> tuple[str | None, list[str]]:
    """(the module a ``from`` import reads, or None for ``import``; the names it imports) with relative imports resolved."""
    if isinstance(node, ast.Import):
        return None, [alias.name for alias in node.names]
    base = package_parts[:len(package_parts) - node.level + 1] if node.level else []
    return ".".join(base + ([node.module] if node.module else [])), [a.name for a in node.names]


def import_edges(src_root: Path) -> dict[tuple[str, str], list[str]]:
    """``{(importer unit, imported unit): ["path:line", ...]}`` for the package under ``src_root``."""
    pkg_dir = src_root / PACKAGE
    edges: dict[tuple[str, str], list[str]] = {}
    for path in sorted(pkg_dir.rglob("*.py")):
        rel = path.relative_to(src_root).with_suffix("")
        parts = list(rel.parts)
        package_parts = parts[:-1]  # the package a relative import starts from (the folder, also for __init__)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        src = _unit(".".join(parts))
        if src is None:  # dprec_torch/__init__.py: the package root re-exports the api, above every layer
            continue
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            module, names = _imported(node, package_parts)
            # `from dprec_torch import privacy` names the unit in the alias, not the module
            targets = names if module is None else [f"{module}.{n}" for n in names] if module == PACKAGE else [module]
            for target in targets:
                dst = _unit(target)
                if dst is not None and dst != src:
                    edges.setdefault((src, dst), []).append(f"{path.relative_to(src_root)}:{node.lineno}")
    return edges


def cycles(edges) -> list[list[str]]:
    """The strongly connected components with more than one unit (Tarjan)."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def upward(edges) -> dict[tuple[str, str], list[str]]:
    """Edges whose target is not on a strictly lower layer than their source."""
    return {e: where for e, where in edges.items() if RANK[e[1]] >= RANK[e[0]]}


def test_every_unit_has_a_layer():
    units = {p.stem if p.is_file() else p.name for p in (ROOT / PACKAGE).iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    missing = sorted(units - set(RANK))
    assert not missing, f"declare {missing} in LAYERS of tests/test_import_graph.py (one layer each)"
    assert sum(len(layer) for layer in LAYERS) == len(RANK), "a unit is listed on two layers"


def test_no_import_cycle_between_units():
    found = cycles(import_edges(ROOT))
    assert not found, f"import cycles between dprec_torch units: {found}"


def test_at_most_one_import_runs_back_up_the_layers():
    up = upward(import_edges(ROOT))
    assert len(up) <= MAX_UPWARD, "imports running back up LAYERS: " + "; ".join(
        f"{a} -> {b} ({', '.join(w)})" for (a, b), w in sorted(up.items()))


def test_the_checks_catch_a_cycle_and_a_function_level_import(tmp_path):
    """The detector itself: a function-level import back up is an edge, a cycle and an upward import;
    the same import under ``if TYPE_CHECKING:`` is not; a ``lazy_import("...")`` is."""
    pkg = tmp_path / PACKAGE
    (pkg / "privacy").mkdir(parents=True)
    (pkg / "mechanisms").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "privacy" / "__init__.py").write_text("")
    (pkg / "mechanisms" / "__init__.py").write_text("")
    (pkg / "mechanisms" / "dpsgd.py").write_text("from ..privacy import budget\n")
    (pkg / "privacy" / "budget.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                               "    from dprec_torch.mechanisms import dpsgd\n")
    edges = import_edges(tmp_path)
    assert set(edges) == {("mechanisms", "privacy")} and not cycles(edges) and not upward(edges)
    (pkg / "privacy" / "cases.py").write_text("def build():\n    from dprec_torch.mechanisms.dpsgd import X\n")
    edges = import_edges(tmp_path)
    assert edges[("privacy", "mechanisms")] == [f"{PACKAGE}/privacy/cases.py:2"]
    assert cycles(edges) == [["mechanisms", "privacy"]]
    assert list(upward(edges)) == [("privacy", "mechanisms")]
    (pkg / "privacy" / "lazy.py").write_text('dpsgd = lazy_import("dprec_torch.mechanisms.dpsgd")\n')  # deferred, still an edge
    assert f"{PACKAGE}/privacy/lazy.py:1" in import_edges(tmp_path)[("privacy", "mechanisms")]


# ------------------------------------------------------------------------------------------- modules
def _modules(src_root: Path) -> dict[str, tuple[Path, list[str]]]:
    """``{dotted module: (path, the package a relative import in it starts from)}``; a package's ``__init__``
    is the package's own node."""
    out = {}
    for path in sorted((src_root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src_root).with_suffix("").parts)
        package_parts = parts[:-1]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = (path, package_parts)
    return out


def module_import_edges(src_root: Path) -> dict[tuple[str, str], list[str]]:
    """``{(importer module, imported module): ["path:line", ...]}`` between the package's own modules.

    The same imports as :func:`import_edges`: at module level AND inside functions (decided: a function-level
    import runs whenever its function does, so it is as real a dependency, and the circles this test was written
    for -- ``mechanisms.context`` importing ``mechanisms.base`` inside ``prior_precision_for``, the harness
    registry importing its case modules on first lookup -- were function-level ones); ``if TYPE_CHECKING:``
    imports are left out (they never run). The imported module is the longest prefix of the import that is a
    module of the package (``from dprec_torch.privacy_harness import sensitivity_cases`` -> that submodule,
    ``from dprec_torch.models.batching import full_batch`` -> ``dprec_torch.models.batching``). The root
    ``dprec_torch/__init__.py`` is left out, as in :func:`import_edges` (it re-exports the api, above every layer).
    """
    mods = _modules(src_root)

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[tuple[str, str], list[str]] = {}
    for src, (path, package_parts) in mods.items():
        if src == PACKAGE:
            continue
        for node in _imports(ast.parse(path.read_text(), filename=str(path))):
            module, names = _imported(node, package_parts)
            targets = names if module is None else [f"{module}.{n}" if f"{module}.{n}" in mods else module for n in names]
            for target in targets:
                dst = resolve(target)
                if dst is not None and dst not in (src, PACKAGE):
                    edges.setdefault((src, dst), []).append(f"{path.relative_to(src_root)}:{node.lineno}")
    return edges


def upward_imports(edges) -> list[str]:
    """Every import statement (``path:line``) between modules of two units that does not run down :data:`LAYERS`."""
    return [where for (a, b), places in sorted(edges.items()) for where in places
            if _unit(a) != _unit(b) and RANK[_unit(b)] >= RANK[_unit(a)]]


def test_no_import_cycle_between_modules():
    """Inside a unit too: the harness registry imports its case modules, never the reverse (they import the case
    types from ``privacy_harness.case``); ``mechanisms.base`` imports ``mechanisms.context``, never the reverse."""
    found = cycles(module_import_edges(ROOT))
    assert not found, f"import cycles between dprec_torch modules: {found}"


def test_at_most_one_module_import_runs_back_up_the_layers():
    """The unit rule counted per import statement: at most :data:`MAX_UPWARD` of them runs back up the layers."""
    up = upward_imports(module_import_edges(ROOT))
    assert len(up) <= MAX_UPWARD, f"imports running back up LAYERS: {up}"


def test_the_module_checks_catch_a_cycle_inside_a_unit(tmp_path):
    """The module-level detector: a function-level import closing a circle inside one unit is a cycle (the unit
    graph cannot see it); the same import under ``if TYPE_CHECKING:`` is not; a submodule named in ``from pkg import``
    is the edge's target."""
    pkg = tmp_path / PACKAGE
    (pkg / "privacy_harness").mkdir(parents=True)
    (pkg / "mechanisms").mkdir()
    for init in (pkg, pkg / "privacy_harness", pkg / "mechanisms"):
        (init / "__init__.py").write_text("")
    (pkg / "privacy_harness" / "registry.py").write_text("from dprec_torch.privacy_harness import cases\n")
    (pkg / "privacy_harness" / "cases.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                                      "    from dprec_torch.privacy_harness.registry import X\n")
    (pkg / "mechanisms" / "base.py").write_text("")
    edges = module_import_edges(tmp_path)
    assert set(edges) == {(f"{PACKAGE}.privacy_harness.registry", f"{PACKAGE}.privacy_harness.cases")}
    assert not cycles(edges) and not upward_imports(edges) and not cycles(import_edges(tmp_path))
    (pkg / "privacy_harness" / "cases.py").write_text("def build():\n    from .registry import X\n")
    (pkg / "mechanisms" / "base.py").write_text("def f():\n    from dprec_torch.privacy_harness.registry import Y\n")
    edges = module_import_edges(tmp_path)
    assert cycles(edges) == [[f"{PACKAGE}.privacy_harness.cases", f"{PACKAGE}.privacy_harness.registry"]]
    assert not cycles(import_edges(tmp_path))  # one unit: invisible to the unit graph
    assert upward_imports(edges) == [f"{PACKAGE}/mechanisms/base.py:2"]
