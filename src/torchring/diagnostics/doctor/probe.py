"""What ``torchring doctor`` learns about one host, printed as one JSON object.

Run on every host (in-process on the local one, over SSH on the others)::

    python -m torchring.diagnostics.doctor.probe [--peers ADDR,ADDR] [--peer-port 22] [--quick]

Nothing here raises: whatever cannot be probed becomes a field holding an ``error`` string, so the
doctor can say what is wrong instead of crashing. torch is imported inside the functions that need it,
so a broken torch is reported like any other finding.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

GIB = 1024**3
SHM_PATH = "/dev/shm"
SHM_MINIMUM_BYTES = GIB
#: Peers are "routable" when a TCP connection to their SSH port succeeds within this many seconds.
PEER_TIMEOUT_S = 2.0
DEFAULT_PEER_PORT = 22
SIOCGIFADDR = 0x8915
SETTING_PREFIXES = ("NCCL_", "GLOO_", "TORCH_", "HOROVOD_", "TORCHRING_")
SETTING_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS")
RDMA_PATH = "/sys/class/infiniband"


def _describe(error: BaseException) -> str:
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _fill(result: dict[str, Any], key: str, getter: Callable[[], Any]) -> None:
    """``result[key] = getter()``; on failure ``result[key] = None`` and ``result[key + "_error"]`` says why."""
    try:
        result[key] = getter()
    except Exception as error:  # noqa: BLE001 - a probe reports, it never raises
        result[key] = None
        result[f"{key}_error"] = _describe(error)


def _guarded(getter: Callable[[], Any]) -> Any:
    """``getter()``, or ``{"error": ...}`` when it fails."""
    try:
        return getter()
    except Exception as error:  # noqa: BLE001
        return {"error": _describe(error)}


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _torchring_version() -> str:
    from torchring.version import __version__

    return __version__


def probe_versions() -> dict[str, Any]:
    """Python, torch and torchring versions; ``torch``/``torchring`` are None (with ``*_error``) when they
    cannot be imported."""
    versions: dict[str, Any] = {"python": platform.python_version(), "python_executable": sys.executable}
    _fill(versions, "torch", _torch_version)
    _fill(versions, "torchring", _torchring_version)
    return versions


def _format_nccl(version: Any) -> str | None:
    """NCCL's version as ``"2.19.3"`` whether torch gives a tuple or an encoded integer."""
    if version is None:
        return None
    if isinstance(version, tuple | list):
        return ".".join(str(part) for part in version)
    number = int(version)
    if number >= 10000:  # NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


def driver_version(timeout_s: float = 10.0) -> str | None:
    """The NVIDIA driver version from ``nvidia-smi``; None when nvidia-smi is not installed."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return None
    result = subprocess.run([executable, "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    lines = [line.strip() for line in result.stdout.splitlines() if line.strip()]
    if result.returncode != 0 or not lines:
        message = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        raise RuntimeError(f"nvidia-smi failed (exit {result.returncode}): {message}")
    return lines[0]


def probe_cuda(driver_timeout_s: float = 10.0) -> dict[str, Any]:
    """GPUs as torch sees them, and the driver, CUDA runtime, NCCL and cuDNN versions."""
    cuda: dict[str, Any] = {}
    try:
        import torch
    except Exception as error:  # noqa: BLE001
        cuda.update(available=False, device_count=0, devices=[], error=f"torch cannot be imported: {_describe(error)}")
        _fill(cuda, "driver_version", lambda: driver_version(driver_timeout_s))
        return cuda
    _fill(cuda, "available", lambda: bool(torch.cuda.is_available()))
    available = bool(cuda["available"])
    _fill(cuda, "device_count", lambda: int(torch.cuda.device_count()) if available else 0)
    _fill(cuda, "devices", lambda: [torch.cuda.get_device_name(i) for i in range(cuda["device_count"] or 0)])
    _fill(cuda, "driver_version", lambda: driver_version(driver_timeout_s))
    _fill(cuda, "cuda_runtime", lambda: torch.version.cuda)
    _fill(cuda, "nccl_version", lambda: _format_nccl(torch.cuda.nccl.version()) if available else None)
    _fill(cuda, "cudnn", lambda: torch.backends.cudnn.version())
    return cuda


def _gloo_available() -> bool:
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


def probe_shm(path: str = SHM_PATH) -> dict[str, Any]:
    """Size of the shared-memory filesystem (DataLoader workers and NCCL need it); ok when >= 1 GiB."""
    shm: dict[str, Any] = {"path": path}
    try:
        stats = os.statvfs(path)
    except OSError as error:
        shm.update(total_bytes=None, free_bytes=None, ok=False, error=f"{path}: {error.strerror or error}")
        return shm
    total = stats.f_blocks * stats.f_frsize
    shm.update(total_bytes=total, free_bytes=stats.f_bavail * stats.f_frsize, ok=total >= SHM_MINIMUM_BYTES)
    return shm


def _ipv4_of(name: str) -> str | None:
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address on this interface
            return None
    return socket.inet_ntoa(packed[20:24])


def probe_interfaces() -> list[dict[str, str]]:
    """Every network interface with an IPv4 address: ``[{"name": ..., "ipv4": ...}]``."""
    interfaces = []
    for _, name in socket.if_nameindex():
        address = _ipv4_of(name)
        if address is not None:
            interfaces.append({"name": name, "ipv4": address})
    return interfaces


def ssh_addresses() -> tuple[str | None, str | None]:
    """(the address SSH reached this host at, the address the SSH client came from), from ``SSH_CONNECTION``."""
    fields = os.environ.get("SSH_CONNECTION", "").split()
    return (fields[2] if len(fields) > 2 else None, fields[0] if fields else None)


def probe_peer(address: str, port: int = DEFAULT_PEER_PORT, timeout_s: float = PEER_TIMEOUT_S) -> dict[str, Any]:
    """Whether a TCP connection to ``address:port`` succeeds within ``timeout_s``."""
    result: dict[str, Any] = {"address": address, "port": port}
    start = time.monotonic()
    try:
        socket.create_connection((address.strip("[]"), port), timeout=timeout_s).close()
        result["reachable"] = True
    except OSError as error:
        result["reachable"] = False
        result["error"] = "timed out" if isinstance(error, TimeoutError) else (error.strerror or _describe(error))
    except Exception as error:  # noqa: BLE001 - e.g. a malformed address
        result["reachable"], result["error"] = False, _describe(error)
    result["seconds"] = round(time.monotonic() - start, 3)
    return result


def probe_peers(addresses: Sequence[str], port: int = DEFAULT_PEER_PORT,
                timeout_s: float = PEER_TIMEOUT_S) -> list[dict[str, Any]]:
    """``probe_peer`` for every address, in parallel (so the whole takes at most ``timeout_s``)."""
    if not addresses:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(addresses))) as pool:
        return list(pool.map(lambda address: probe_peer(address, port, timeout_s), addresses))


def probe_settings() -> dict[str, str]:
    """The environment variables that change how NCCL, Gloo, torch, Horovod and torchring behave."""
    return {name: value for name, value in sorted(os.environ.items())
            if name.startswith(SETTING_PREFIXES) or name in SETTING_NAMES}


def probe_rdma(path: str = RDMA_PATH) -> list[str]:
    """Names of the RDMA (InfiniBand/RoCE) devices; empty without any."""
    directory = Path(path)
    return sorted(entry.name for entry in directory.iterdir()) if directory.is_dir() else []


def _cgroup_runtime(path: str = "/proc/1/cgroup") -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    for marker, runtime in (("kubepods", "kubernetes"), ("docker", "docker"), ("containerd", "containerd")):
        if marker in text:
            return runtime
    return None


def probe_container() -> dict[str, str] | None:
    """``{"runtime": ..., "evidence": ...}`` when this process runs in a container, else None."""
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return {"runtime": "kubernetes", "evidence": "KUBERNETES_SERVICE_HOST is set"}
    if os.path.exists("/run/.containerenv"):
        return {"runtime": "podman", "evidence": "/run/.containerenv"}
    if os.path.exists("/.dockerenv"):
        return {"runtime": "docker", "evidence": "/.dockerenv"}
    runtime = _cgroup_runtime()
    if runtime is not None:
        return {"runtime": runtime, "evidence": "/proc/1/cgroup"}
    return None


def probe(peers: Sequence[str] = (), quick: bool = False, peer_port: int = DEFAULT_PEER_PORT) -> dict[str, Any]:
    """Everything about this host as a JSON-ready dict; ``peers`` are tested on TCP ``peer_port``. ``quick``
    skips the peer tests and waits at most 2 s for nvidia-smi."""
    start = time.monotonic()
    report: dict[str, Any] = {}
    _fill(report, "hostname", socket.gethostname)
    report["platform"] = _guarded(platform.platform)
    report["cpus"] = os.cpu_count()
    report.update(probe_versions())
    report["cuda"] = _guarded(lambda: probe_cuda(2.0 if quick else 10.0))
    _fill(report, "gloo_available", _gloo_available)
    report["shm"] = _guarded(probe_shm)
    report["interfaces"] = _guarded(probe_interfaces)
    report["ssh_address"], report["ssh_client_address"] = ssh_addresses()
    if quick:
        report["peers"], report["peers_skipped"] = [], bool(peers)
    else:
        report["peers"] = _guarded(lambda: probe_peers(list(peers), peer_port))
    report["settings"] = _guarded(probe_settings)
    report["rdma"] = _guarded(probe_rdma)
    report["container"] = _guarded(probe_container)
    report["probe_seconds"] = round(time.monotonic() - start, 3)
    return report


def _addresses(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def main(argv: Sequence[str] | None = None) -> int:
    """Print this host's probe as one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m torchring.diagnostics.doctor.probe",
                                     description="Describe this host for torchring doctor, as one JSON object.")
    parser.add_argument("--peers", type=_addresses, default=[], metavar="ADDR,ADDR",
                        help="addresses of the other hosts; each is tested with a TCP connection")
    parser.add_argument("--peer-port", type=int, default=DEFAULT_PEER_PORT,
                        help=f"TCP port tested on the peers (default {DEFAULT_PEER_PORT}, SSH)")
    parser.add_argument("--quick", action="store_true", help="skip the peer tests")
    args = parser.parse_args(argv)
    print(json.dumps(probe(args.peers, args.quick, args.peer_port), default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
