"""The small supervisor that runs one rank on a remote host: ``python -m torchring.launch.remote_rank``.

The launcher starts it over SSH and writes one JSON line to its standard input: the command, the
environment and the working directory (so no argument or value ever passes through a remote shell).
It then keeps the SSH channel open. The rank runs in a process group of its own, with its output on
the SSH channel. When the channel closes (the launcher stopped the job, died, or the connection
dropped) or the launcher writes ``stop``, the whole process group is terminated (SIGTERM, then SIGKILL
after a grace period). When the rank ends, what it left in its group is killed too, the spec's
``cleanup`` commands run (``docker stop`` for a rank in a container, which outlives its client), and
this process exits with the rank's exit code (128 + N for a rank killed by signal N).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from typing import Any

GRACE_PERIOD_S = 3.0
CLEANUP_TIMEOUT_S = 20.0
#: Exit code when the rank could not be started at all (as a shell reports a missing command).
CANNOT_START = 127


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def _stop_when_told(process: subprocess.Popen, stopped: threading.Event) -> None:
    """Wait for EOF or a ``stop`` line on stdin, then end the rank's process group."""
    for line in sys.stdin:
        if line.strip() == "stop":
            break
    stopped.set()
    if process.poll() is None:
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=GRACE_PERIOD_S)
        except subprocess.TimeoutExpired:
            pass
    _signal_group(process.pid, signal.SIGKILL)


def _read_spec() -> dict[str, Any]:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(CANNOT_START)
    return json.loads(line)


def main() -> int:
    spec = _read_spec()
    env = dict(spec["env"])
    if spec.get("horovod_compat"):
        from ..compat import SHIM_PATH

        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM_PATH), env.get("PYTHONPATH")) if p)
    cwd = spec.get("cwd")
    if cwd and not os.path.isdir(cwd):
        print(f"torchring: working directory {cwd!r} does not exist on this host; run the launcher from a "
              "directory that exists on every host", file=sys.stderr)
        return CANNOT_START
    try:
        process = subprocess.Popen(spec["command"], env=env, cwd=cwd or None, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    except OSError as error:
        print(f"torchring: cannot start {spec['command'][0]!r} on this host: {error.strerror}", file=sys.stderr)
        return CANNOT_START
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, lambda s, _f: _signal_group(process.pid, signal.SIGTERM))
    stopped = threading.Event()
    threading.Thread(target=_stop_when_told, args=(process, stopped), daemon=True).start()
    returncode = process.wait()
    _signal_group(process.pid, signal.SIGKILL)  # whatever the rank left behind (DataLoader workers, ...)
    _clean_up(spec.get("cleanup") or [], env)
    return 128 + (-returncode) if returncode < 0 else returncode


def _clean_up(commands: list[list[str]], env: dict[str, str]) -> None:
    """Run the spec's clean-up commands (``docker stop`` for a rank in a container), best effort."""
    for command in commands:
        try:
            subprocess.run(command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=CLEANUP_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired):
            pass


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
