"""Run on each remote host during preflight (``python -m torchring.launch.spawn.host_probe PORT TIMEOUT
ADDRESS``): print one JSON line with what the launcher needs to know about the host.

It reports the Python, torch and torchring versions (torch's without importing it, which costs
seconds of CPU), the CPU count, whether the host has NVIDIA GPUs, the launcher's address as this host
sees it (from ``SSH_CONNECTION``; under ``srun`` the launcher passes it as ADDRESS) and whether the
rendezvous store answers there (or at ADDRESS when given), and the interface holding the address SSH
reached this host at (or the one routing to ADDRESS). It imports nothing heavier than the standard library and
``network``/``containers``, so that it answers within the start timeout.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from importlib import metadata
from typing import Any

from ...network import interface_of, route_source
from .containers import host_has_nvidia_gpus


def installed_version(module: str) -> tuple[str | None, str | None]:
    """The installed version of ``module`` and None, or None and why it cannot be told: the version its
    distribution declares (without importing it), or its ``__version__`` where no distribution is installed."""
    try:
        try:
            return metadata.version(module), None
        except metadata.PackageNotFoundError:
            return __import__(module).__version__, None  # e.g. a source checkout on PYTHONPATH
    except Exception as error:  # noqa: BLE001 - any failure is reported, not raised
        return None, repr(error)


def host_report(store_port: int, timeout_s: float, store_address: str) -> dict[str, Any]:
    """What preflight learns about this host (the keys ``ssh.HostReport`` reads)."""
    report: dict[str, Any] = {"python": platform.python_version(), "hostname": socket.gethostname(),
                              "cpus": os.cpu_count() or 1}
    for module in ("torch", "torchring"):
        report[module], error = installed_version(module)
        if error is not None:
            report[module + "_error"] = error
    try:
        report["nvidia_gpus"] = host_has_nvidia_gpus()
    except Exception:  # noqa: BLE001 - no answer from nvidia-smi: no GPUs for containers
        report["nvidia_gpus"] = False
    connection = os.environ.get("SSH_CONNECTION", "").split()
    report["launcher_address"] = connection[0] if connection else None
    report["own_address"] = connection[2] if len(connection) > 2 else None
    address = store_address or report["launcher_address"] or ""
    try:
        socket.create_connection((address, store_port), timeout=timeout_s).close()
        report["store_reachable"] = True
    except OSError as error:
        report["store_reachable"], report["store_error"] = False, f"{address}:{store_port}: {error}"
    if report["own_address"] is None and address:  # started by srun, not SSH: the route towards the store
        report["own_address"] = route_source(address)
    report["interface"] = interface_of(report["own_address"]) if report["own_address"] else None
    return report


def main(argv: list[str]) -> None:
    port, timeout_s, address = int(argv[0]), float(argv[1]), argv[2] if len(argv) > 2 else ""
    print(json.dumps(host_report(port, timeout_s, address)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
