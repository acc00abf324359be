"""What ``import torchring`` loads (the layers and import circles: ``test_layers``)."""

import inspect
import json
import subprocess
import sys
from pathlib import Path

import torchring
from torchring.launch import function_job as function

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
