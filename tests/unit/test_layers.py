"""The package's layers: no module imports one of a higher layer, and no import circle anywhere.

Every import counts: at module level, inside functions and under ``TYPE_CHECKING``. The layers are
listed lowest first; a module belongs to the layer of the longest prefix that names it. Modules of one
layer may import each other (without circles) and anything lower.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"

#: Lowest first. Each entry: the module prefixes (relative to ``torchring``) of one layer.
LAYERS: list[tuple[str, ...]] = [
    # leaf modules shared by every side: names, errors, settings, signing
    ("contract", "exceptions", "reduction", "compression", "version", "capabilities", "store_auth", "network",
     "rank_failure", "settings", "compat"),
    ("environments",),
    ("metrics",),
    ("runtime", "runtime.requests", "runtime.wake_probe"),
    ("runtime.observe",),
    ("runtime.coordination",),
    ("runtime.dataplane",),
    ("runtime.engine", "runtime.cycle_start"),
    ("runtime.context", "runtime.meeting", "runtime.assembly"),
    ("runtime.submit",),
    # the public API
    ("basics", "process_sets", "operations", "autograd_functions", "collectives", "grouped", "functions",
     "sync_batch_norm", "logging_utils"),
    ("optim",),
    ("optimizer",),
    ("elastic",),
    # the launcher: never imported by a rank
    ("launch.hosts", "launch.rendezvous"),
    ("launch.sampling",),
    ("launch.spawn",),
    ("launch.watch",),
    ("launch.supervisor", "launch.elastic"),
    ("launch.job",),
    ("launch.function_job",),
    ("launch.cli",),
    # the package's facade and the tools
    ("", "function_job", "cli", "__main__", "launch", "launch.function_rank", "bench", "deploy", "diagnostics",
     "compat.shim"),
]


def layer_of(module: str, layers: list[tuple[str, ...]] = LAYERS) -> int:
    """The index of ``module``'s layer (the longest matching prefix wins)."""
    best, best_length = None, -1
    for index, prefixes in enumerate(layers):
        for prefix in prefixes:
            matches = prefix == "" or module == prefix or module.startswith(prefix + ".")
            if matches and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best is None:
        raise LookupError(f"module torchring.{module} is in no layer: add it to LAYERS")
    return best


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    found = {}
    for path in (root / "torchring").rglob("*.py"):
        parts = list(path.relative_to(root / "torchring").with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def import_graph(root: Path = SRC) -> dict[str, dict[str, int]]:
    """module -> {imported module: line}, for every import of a ``torchring`` module anywhere in it."""
    modules = _modules(root)
    graph: dict[str, dict[str, int]] = {}
    for module, (path, is_package) in modules.items():
        imported: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = [part for part in base if part]
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif node.module == "torchring" or (node.module or "").startswith("torchring."):
                    target = node.module.removeprefix("torchring").lstrip(".")
                else:
                    continue
                # ``from package import module`` imports that module; ``from module import name`` the module
                targets = [full if full in modules else target
                           for full in (f"{target}.{alias.name}".lstrip(".") for alias in node.names)]
                targets = ["torchring." + t if t else "torchring" for t in targets]
            for name in targets:
                if name != "torchring" and not name.startswith("torchring."):
                    continue
                relative = name.removeprefix("torchring").lstrip(".")
                while relative not in modules and relative:
                    relative = relative.rpartition(".")[0]
                # a module importing its own package is the package being set up
                if relative != module and not module.startswith(relative + ".") and relative in modules:
                    imported.setdefault(relative, node.lineno)
        graph[module] = imported
    return graph


def layer_violations(graph: dict[str, dict[str, int]], layers: list[tuple[str, ...]] = LAYERS) -> list[str]:
    """Every import of a higher layer, in words."""
    found = []
    for module, imported in sorted(graph.items()):
        own = layer_of(module, layers)
        for target, line in sorted(imported.items()):
            if layer_of(target, layers) > own:
                found.append(f"torchring.{module} (line {line}) imports torchring.{target} of a higher layer")
    return found


def find_cycle(graph: dict[str, dict[str, int]] | dict[str, set[str]]) -> list[str] | None:
    """One import circle as a path ``[a, b, ..., a]``, or None."""
    done: set[str] = set()
    for start in sorted(graph):
        if start in done:
            continue
        path, on_path = [start], {start}
        pending = [iter(sorted(graph[start]))]
        while pending:
            following = next(pending[-1], None)
            if following is None:
                pending.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif following in on_path:
                return path[path.index(following):] + [following]
            elif following not in done:
                path.append(following)
                on_path.add(following)
                pending.append(iter(sorted(graph.get(following, ()))))
    return None


def test_no_module_imports_a_higher_layer():
    assert layer_violations(import_graph()) == []


def test_the_package_has_no_import_circle_even_inside_functions():
    assert find_cycle(import_graph()) is None


def test_every_module_is_in_a_layer():
    for module in import_graph():
        layer_of(module)


def _plant(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = tmp_path / "torchring" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def test_a_planted_upward_import_inside_a_function_is_found(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "metrics/__init__.py": "", "runtime/__init__.py": "",
                             "runtime/context.py": "",
                             "metrics/counters.py": "def rank():\n    from ..runtime import context\n"})
    assert layer_violations(import_graph(root)) == [
        "torchring.metrics.counters (line 2) imports torchring.runtime.context of a higher layer"]


def test_a_planted_circle_is_found(tmp_path):
    root = _plant(tmp_path, {"__init__.py": "", "a.py": "from . import b\n",
                             "b.py": "def f():\n    from torchring import a\n"})
    assert find_cycle(import_graph(root)) == ["a", "b", "a"]


def test_a_module_outside_every_layer_is_named():
    with pytest.raises(LookupError, match="torchring.newthing"):
        layer_of("newthing", [("contract",)])
