"""The command to run on every rank, checked before any rank starts.

The mistakes of a first hour get an error that says what to type instead (a script given as the
program, a script without a ``#!`` line, the launcher's options after the command), and a bare
``python``/``python3`` that cannot import torch (the venv not activated, ``.venv/bin/torchring run
python train.py``) is replaced by the interpreter the launcher runs under, which can, and the launcher
says so once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence

__all__ = ["LAUNCHER_FLAGS", "check_command", "misplaced_flags"]

PYTHON_NAMES = ("python", "python3")
#: Flags of the launcher that, found after the program, were most likely meant for the launcher.
LAUNCHER_FLAGS = ("-np", "--num-proc", "-H", "--hosts", "--hostfile", "--min-np", "--max-np")
#: The first bytes of files the kernel can execute: a script with its interpreter line, or an ELF binary.
EXECUTABLE_MAGIC = (b"#!", b"\x7fELF")


def check_command(command: Sequence[str], example: str, local: bool,
                  log: Callable[[str], None]) -> list[str]:
    """``command`` as the ranks will run it; ``ValueError`` saying what to type for the usual mistakes.

    ``example`` is the start of a correct command line (``torchring run -np 2``) for the messages;
    ``local``: every rank runs on this host (only then is a bare ``python`` replaced)."""
    command = list(command)
    program = command[0]
    rest = " ".join(command[1:])
    if os.sep not in program and shutil.which(program) is None and os.path.isfile(program):
        fix = f"python {program}" if program.endswith(".py") else f"./{program}"
        raise ValueError(f"{program!r} is a file here, not a program on PATH; start it as: {example} {fix} {rest}"
                         .rstrip())
    if os.sep in program and os.path.isfile(program) and not _kernel_can_execute(program):
        raise ValueError(f"{program!r} has no '#!' line, so it cannot be run as a program; start it with its "
                         f"interpreter: {example} python {program} {rest}".rstrip())
    if local and program in PYTHON_NAMES:
        return _with_python_that_has_torch(command, log)
    return command


def misplaced_flags(command: Sequence[str]) -> list[str]:
    """The launcher's flags given after the program (``torchring run python train.py -np 2``)."""
    return [word for word in command[1:] if word.split("=", 1)[0] in LAUNCHER_FLAGS]


def _kernel_can_execute(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            head = file.read(4)
    except OSError:
        return True  # not readable here: let the start itself say why
    return head.startswith(EXECUTABLE_MAGIC)


def _imports_torch(python: str) -> bool:
    """Whether ``python`` finds the ``torch`` package (without importing it: a few milliseconds)."""
    try:
        return subprocess.run([python, "-c", "import importlib.util, sys; "
                                             "sys.exit(importlib.util.find_spec('torch') is None)"],
                              stdin=subprocess.DEVNULL, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _with_python_that_has_torch(command: list[str], log: Callable[[str], None]) -> list[str]:
    found = shutil.which(command[0])
    if found is not None and (os.path.abspath(found) == os.path.abspath(sys.executable) or _imports_torch(found)):
        return command  # the launcher's own interpreter (an activated venv) needs no probe
    own = sys.executable
    if found is None:
        log(f"no {command[0]!r} on PATH: the ranks run {own}, the interpreter torchring runs under")
    else:
        log(f"{command[0]!r} on PATH ({found}) cannot import torch: the ranks run {own} instead, the interpreter "
            "torchring runs under (activate its environment, or give an interpreter's path, to choose yourself)")
    return [own, *command[1:]]
