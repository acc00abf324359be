"""What ``import torchring`` loads, and that the package's modules import each other without cycles."""

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import torchring
from torchring.launch import function

SRC = Path(__file__).resolve().parents[2] / "src"

#: Packages only the launcher and the command-line tools need; a rank must not load them.
LAUNCHER_ONLY = ("torchring.launch", "torchring.bench", "torchring.deploy", "torchring.diagnostics",
                 "torchring.compat", "torchring.cli")


def test_import_torchring_loads_no_launcher_or_cli_module():
    code = "import json, sys, torchring; print(json.dumps(sorted(sys.modules)))"
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                                       text=True).stdout)
    unwanted = [name for name in loaded
                if any(name == package or name.startswith(package + ".") for package in LAUNCHER_ONLY)]
    assert unwanted == []


def test_run_has_the_launchers_signature():
    assert inspect.signature(torchring.run) == inspect.signature(function.run)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(module: str, is_package: bool, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules that ``module`` imports at module level (not inside functions)."""
    found: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            candidates = [target, *(f"{target}.{alias.name}" for alias in node.names)]
            found.update(name for name in candidates if name in known)
    # a module importing its own parent package is the package being set up, not a cycle
    return {name for name in found if name != module and not module.startswith(name + ".")}


def _import_graph() -> dict[str, set[str]]:
    files = {_module_name(path): path for path in (SRC / "torchring").rglob("*.py")}
    known = set(files)
    return {module: _imports(module, path.name == "__init__.py", ast.parse(path.read_text()), known)
            for module, path in files.items()}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path ``[a, b, ..., a]``, or None."""
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
                pending.append(iter(sorted(graph[following])))
    return None


def test_the_package_has_no_module_level_import_cycle():
    assert _find_cycle(_import_graph()) is None


def test_the_cycle_finder_finds_a_cycle():
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None
