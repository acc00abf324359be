"""``torchring.run(fn, ...)``: the public entry point, which loads the launcher only when called.

Every rank imports ``torchring``; only the process that starts a job needs ``torchring.launch``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any


def run(fn: Callable[..., Any], args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None,
        np: int | None = None, hosts: str | None = None, hostfile: str | None = None, *,
        num_proc: int | None = None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
        start_timeout: float = 30.0, network_interface: str | Sequence[str] | None = None,
        env: Mapping[str, str] | None = None, output_filename: str | None = None, verbose: bool = False,
        executable: str | None = None) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` on ``np`` ranks (on ``hosts``, e.g. ``"a:2,b:2"``, or this host) and
    return the list of results in rank order. The function typically calls ``hvd.init()`` itself.

    Raises ``torchring.launch.function_job.FunctionJobError`` when a rank fails: its ``rank`` and ``error``
    (the last line the rank wrote to stderr, typically its exception) name it; the whole traceback is
    in the job's output."""
    from .launch.function_job import run as run_job_function

    return run_job_function(fn, args, kwargs, np, hosts, hostfile, num_proc=num_proc, ssh_port=ssh_port,
                            ssh_identity_file=ssh_identity_file, start_timeout=start_timeout,
                            network_interface=network_interface, env=env, output_filename=output_filename,
                            verbose=verbose, executable=executable)
