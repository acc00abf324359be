"""Compatibility with unchanged Horovod scripts.

``shim/`` holds a top-level ``horovod`` package whose ``horovod.torch`` is torchring.
``torchring run --horovod-compat`` puts ``shim/`` first on the workers' ``PYTHONPATH``, so
``import horovod.torch as hvd`` runs on torchring without editing the script.
"""

from __future__ import annotations

from pathlib import Path

SHIM_PATH = Path(__file__).resolve().parent / "shim"
