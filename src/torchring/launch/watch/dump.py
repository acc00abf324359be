"""``torchring dump [PID ...]``: print where every rank of running jobs is, from another terminal.

It sends SIGUSR1 to each ``torchring run`` launcher (the given pids, else every one this user runs on
this host), waits for the launcher to rewrite its report file (``<TMPDIR>/torchring-stacks-<pid>.txt``,
with the launcher's ``TMPDIR``) and prints it. The launcher also prints the report on its own stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["add_dump_arguments", "ask_for_report", "find_launchers", "run_dump"]

#: How long to wait for a launcher's report (it samples every rank once, about a second at most).
REPORT_WAIT_S = 15.0


def add_dump_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``torchring dump``."""
    parser.add_argument("pids", nargs="*", type=int, metavar="PID",
                        help="launcher pid(s) (default: every torchring run of this user on this host)")


def _is_launcher(pid: int) -> bool:
    """Whether ``pid`` is a ``torchring run`` process (``torchring run ...`` or ``python -m torchring run``)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    names = [os.path.basename(arg.decode(errors="replace")) for arg in argv]
    return any(name == "torchring" and names[index + 1:index + 2] == ["run"] for index, name in enumerate(names))


def find_launchers() -> list[int]:
    """Pids of this user's ``torchring run`` launchers on this host (not this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        if _is_launcher(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _report_path(pid: int) -> Path:
    """Where launcher ``pid`` writes its on-request report (its own ``TMPDIR``, else the default)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        environ = []
    tmpdir = next((item[len(b"TMPDIR="):].decode() for item in environ if item.startswith(b"TMPDIR=")), None)
    return Path(tmpdir or tempfile.gettempdir()) / f"torchring-stacks-{pid}.txt"


def _version(path: Path) -> tuple[int, int] | None:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns


def ask_for_report(pid: int) -> str:
    """Signal launcher ``pid`` and return its new report (``OSError``/``TimeoutError`` saying why not)."""
    path = _report_path(pid)
    before = _version(path)
    os.kill(pid, signal.SIGUSR1)
    deadline = time.monotonic() + REPORT_WAIT_S
    while time.monotonic() < deadline:
        if _version(path) not in (before, None):  # the launcher replaces the file whole (os.replace)
            return path.read_text()
        time.sleep(0.05)
    raise TimeoutError(f"launcher {pid} did not write {path} within {REPORT_WAIT_S:g} s; look at its stderr, "
                       "where the report is printed too")


def run_dump(args: argparse.Namespace) -> int:
    """``torchring dump``: 0 when every launcher answered, 1 otherwise."""
    pids = args.pids or find_launchers()
    if not pids:
        print("torchring dump: no running 'torchring run' of yours on this host; pass the launcher's pid",
              file=sys.stderr)
        return 1
    code = 0
    for pid in pids:
        if not _is_launcher(pid):
            print(f"torchring dump: pid {pid} is not a running 'torchring run'; find the launcher's pid with "
                  "ps, or leave the pid out", file=sys.stderr)
            code = 1
            continue
        try:
            report = ask_for_report(pid)
        except (OSError, TimeoutError) as error:
            print(f"torchring dump: launcher {pid}: {error}", file=sys.stderr)
            code = 1
            continue
        print(f"==== torchring run, pid {pid} ====")
        print(report, end="", flush=True)
    return code
