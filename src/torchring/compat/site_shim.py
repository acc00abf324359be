"""``torchring horovod-shim install|remove|status``: the ``horovod`` shim for every process of one Python
environment, for launchers that cannot put it on the ranks' path themselves (``mpirun``, ``srun``).

``install`` writes one ``.pth`` file into the environment's ``site-packages``: Python's ``site`` module
then appends the shim's directory to ``sys.path`` of every interpreter of that environment, after
``site-packages`` itself, so an installed Horovod would still win (``install`` refuses while one is
there). ``remove`` deletes the file; nothing else is written.
"""

from __future__ import annotations

import importlib.util
import os
import sysconfig
import tempfile
from pathlib import Path

from . import SHIM_PATH

__all__ = ["PTH_NAME", "ShimError", "install", "real_horovod", "remove", "site_packages", "status"]

#: The file ``install`` writes into ``site-packages``.
PTH_NAME = "torchring-horovod-shim.pth"


class ShimError(RuntimeError):
    """The shim cannot be installed here; the message says why and what to do instead."""


def site_packages() -> Path:
    """The ``site-packages`` of the running interpreter's environment."""
    return Path(sysconfig.get_paths()["purelib"])


def real_horovod() -> Path | None:
    """Where an installed Horovod (not torchring's shim) is found on this interpreter's path, if anywhere."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or spec.origin is None:
        return None
    origin = Path(spec.origin).resolve()
    return None if SHIM_PATH.resolve() in origin.parents else origin.parent


def install(site_dir: Path | None = None) -> Path:
    """Write the ``.pth`` file into ``site_dir`` (default: this environment's ``site-packages``); its path."""
    found = real_horovod()
    if found is not None:
        raise ShimError(f"Horovod itself is installed in this environment ({found}); `import horovod.torch` "
                        "would keep loading it. Uninstall it (pip uninstall horovod) to use torchring under "
                        "every launcher, or start jobs with `torchring run --horovod-compat`, which puts the "
                        "shim first for that job only.")
    directory = site_packages() if site_dir is None else site_dir
    target = directory / PTH_NAME
    descriptor, temporary = tempfile.mkstemp(dir=directory, prefix=".torchring-shim-", suffix=".tmp")
    try:
        with os.fdopen(descriptor, "w") as handle:
            handle.write(f"{SHIM_PATH}\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def remove(site_dir: Path | None = None) -> Path | None:
    """Delete the ``.pth`` file; its path, or None when there was none."""
    target = (site_packages() if site_dir is None else site_dir) / PTH_NAME
    if not target.exists():
        return None
    target.unlink()
    return target


def status(site_dir: Path | None = None) -> str:
    """One line: whether the shim is installed, and what ``import horovod`` gives this interpreter."""
    target = (site_packages() if site_dir is None else site_dir) / PTH_NAME
    found = real_horovod()
    installed = f"installed ({target})" if target.exists() else f"not installed (no {target})"
    horovod = f"Horovod itself, at {found}" if found is not None else (
        "torchring" if importlib.util.find_spec("horovod") is not None else "nothing (ModuleNotFoundError)")
    return f"torchring's horovod shim: {installed}; `import horovod` here gives {horovod}"
