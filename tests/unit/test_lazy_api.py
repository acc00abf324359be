"""``import torchring`` loads no torch; the API appears on first use, and what type checkers see matches it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import torchring

INIT = Path(torchring.__file__)


def test_the_launchers_supervisor_and_the_package_load_without_torch():
    code = ("import sys, torchring, torchring.launch.spawn.remote_rank, torchring.launch.spawn.containers; "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stdout + result.stderr


def test_every_public_name_loads_and_star_import_gives_the_whole_api():
    for name in torchring.__all__:
        assert getattr(torchring, name) is not None, name
    namespace: dict[str, object] = {}
    exec("from torchring import *", namespace)  # noqa: S102 - the statement under test
    assert set(torchring.__all__) <= set(namespace)
    assert torchring.elastic.run is not None and "init" in dir(torchring)


def test_the_type_checking_imports_list_exactly_the_lazy_names():
    tree = ast.parse(INIT.read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and getattr(node.test, "id", "") ==
                 "TYPE_CHECKING")
    imported = {alias.name for node in block.body if isinstance(node, ast.ImportFrom) for alias in node.names}
    assert imported == set(torchring.__all__) - {"__version__"}
    modules = {node.module for node in block.body if isinstance(node, ast.ImportFrom) and node.module}
    assert modules == set(torchring._API)


def test_an_unknown_name_is_an_attribute_error():
    try:
        torchring.no_such_function  # noqa: B018 - the lookup under test
    except AttributeError as error:
        assert "no_such_function" in str(error)
    else:
        raise AssertionError("torchring.no_such_function did not raise")
