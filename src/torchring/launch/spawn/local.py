"""Starting workers on this host, each the leader of its own process group."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

_PR_SET_PDEATHSIG = 1


def _die_with_launcher() -> None:
    """Runs in the child before exec: own session, and SIGKILL if the launcher dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def spawn_local(command: Sequence[str], env: Mapping[str, str], cwd: str | None = None) -> subprocess.Popen:
    """Start ``command`` in a new session (so its whole process group can be signalled), output piped."""
    try:
        return subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_launcher,
        )
    except FileNotFoundError:
        raise FileNotFoundError(f"command not found: {command[0]!r}; check the spelling or your PATH") from None
    except PermissionError:
        raise PermissionError(f"cannot execute {command[0]!r}: permission denied") from None


def signal_group(process: subprocess.Popen, signum: int) -> None:
    """Send ``signum`` to the process group that ``process`` leads, ignoring a group already gone. A handle
    that is not a local process (a Ray actor's) is given the signal to act on itself."""
    if not isinstance(process, subprocess.Popen):
        process.send_signal(signum)
        return
    try:
        os.killpg(process.pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def terminate_groups(processes: Sequence[subprocess.Popen], grace_period_s: float) -> None:
    """SIGTERM the process group of each of ``processes``, SIGKILL what is left after the grace period
    (which also reaps children, such as DataLoader workers, that outlived their leader)."""
    for process in processes:
        if process.poll() is None:
            signal_group(process, signal.SIGTERM)
            signal_group(process, signal.SIGCONT)  # a stopped (frozen) process gets its SIGTERM too
    deadline = time.monotonic() + grace_period_s
    for process in processes:
        try:
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for process in processes:
        signal_group(process, signal.SIGKILL)
        if process.poll() is None:
            process.wait()
