"""``torchring doctor``: probe every host, then turn what was found into checks that pass or fail.

The local host is probed in-process; every other host over SSH, with ``doctor_probe``. This happens in
two rounds: the first learns each host's address (the one SSH reached it at, which works even where
the host's name does not resolve locally), the second has each host try a TCP connection to the
others' SSH port. A failed check is *blocking* when training cannot start or would fail because of it.
"""

from __future__ import annotations

import json
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from ...launch.hosts import is_local_host
from ...launch.spawn.ssh import SshOptions, ssh_argv
from . import probe as doctor_probe

#: The host name of checks that compare hosts with each other.
ALL_HOSTS = "all hosts"
NO_GPU_DETAIL = "no GPU: training runs on CPU with Gloo"
SHM_FIX = ("run the container with --ipc=host or --shm-size=8g; on Kubernetes mount an emptyDir with "
           "medium: Memory at /dev/shm")
UNREACHABLE_FIX = ("check that `ssh {host} true` works without a password (keys in ssh-agent or -i, host key "
                   "accepted), or raise --start-timeout if the host is slow to answer")
PEERS_FIX = ("the hosts must reach each other directly: open the firewall between them, and if they have "
             "several networks pick the one they share with `torchring run --network-interface IFACE`")
INSTALL_FIX = "install {what} for {python} on that host (pip install {what}), or pass --python with one that has it"


@dataclass(frozen=True)
class Check:
    """One finding: ``ok`` False and ``blocking`` True means training cannot work until ``fix`` is done."""

    host: str
    name: str
    ok: bool
    blocking: bool
    detail: str
    fix: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The check as a JSON-ready dict."""
        return asdict(self)


@dataclass
class DoctorReport:
    """Raw probe data per host (in the order given), the checks derived from it, and the bench results."""

    hosts: dict[str, dict[str, Any]]
    checks: list[Check]
    bench: dict[str, Any] | None = field(default=None)

    @property
    def problems(self) -> list[Check]:
        """The failed checks that block training."""
        return [check for check in self.checks if check.blocking and not check.ok]

    @property
    def ok(self) -> bool:
        """True when nothing blocks training."""
        return not self.problems

    @property
    def exit_code(self) -> int:
        """0 when nothing blocks training, 1 otherwise."""
        return exit_code(self.checks)

    def to_dict(self) -> dict[str, Any]:
        """``{"ok", "hosts", "checks"}`` (and ``"bench"`` when it ran), JSON-ready."""
        data: dict[str, Any] = {"ok": self.ok, "hosts": self.hosts, "checks": [c.to_dict() for c in self.checks]}
        if self.bench is not None:
            data["bench"] = self.bench
        return data


def exit_code(checks: Sequence[Check]) -> int:
    """0 when no blocking check failed, 1 otherwise."""
    return 1 if any(check.blocking and not check.ok for check in checks) else 0


# ---------------------------------------------------------------------------------------------- probing

def _last_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "no message"


def _failed_probe(stderr: str, returncode: int, python: str) -> dict[str, Any]:
    """Why the probe's interpreter failed on a host that SSH did reach."""
    if "No module named 'torchring'" in stderr:
        kind = "torchring_missing"
    elif "No module named 'torch'" in stderr or "import torch" in stderr or "/torch/" in stderr:
        kind = "torch_broken"
    else:
        kind = "probe_failed"
    return {"error": f"{python} failed there (exit {returncode}): {_last_lines(stderr)}", "error_kind": kind}


def probe_remote(host: str, options: SshOptions, peers: Sequence[str] = (), quick: bool = False) -> dict[str, Any]:
    """Run ``doctor_probe`` on ``host`` over SSH; a host that cannot be probed gives ``{"error", "error_kind"}``
    (``unreachable``, ``torchring_missing``, ``torch_broken`` or ``probe_failed``)."""
    remote = [options.python, "-m", "torchring.diagnostics.doctor.probe"]
    if peers:
        remote += ["--peers", ",".join(peers)]
    if options.port is not None:
        remote += ["--peer-port", str(options.port)]
    if quick:
        remote.append("--quick")
    try:
        result = subprocess.run(ssh_argv(host, remote, options), stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=options.connect_timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"no answer over SSH within {options.connect_timeout_s:g} s (--start-timeout)",
                "error_kind": "unreachable"}
    except FileNotFoundError:
        return {"error": "the ssh client is not installed on this machine (install openssh-client)",
                "error_kind": "unreachable"}
    if result.returncode == 255:
        return {"error": f"SSH failed: {_last_lines(result.stderr)}", "error_kind": "unreachable"}
    if result.returncode != 0:
        return _failed_probe(result.stderr, result.returncode, options.python)
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": f"unexpected probe output: {_last_lines(result.stdout + result.stderr)}",
                "error_kind": "probe_failed"}
    return data if isinstance(data, dict) else {"error": f"unexpected probe output: {data!r}",
                                                "error_kind": "probe_failed"}


def _own_addresses(data: Mapping[str, Any]) -> list[str]:
    interfaces = data.get("interfaces")
    if not isinstance(interfaces, list):
        return []
    return [entry["ipv4"] for entry in interfaces if not str(entry.get("ipv4", "")).startswith("127.")]


def _peer_targets(source: str, hosts: Sequence[str], data: Mapping[str, dict[str, Any]],
                  local: Mapping[str, bool]) -> dict[str, str]:
    """{other host: the address ``source`` should test it at}; the same machine under two names is skipped."""
    targets: dict[str, str] = {}
    for target in hosts:
        if target == source or (local[source] and local[target]) or "error" in data[target]:
            continue
        if not local[target]:
            targets[target] = data[target].get("ssh_address") or target
        elif data[source].get("ssh_client_address"):  # the local host, as the remote one sees it
            targets[target] = data[source]["ssh_client_address"]
        else:
            addresses = _own_addresses(data[target])
            targets[target] = addresses[0] if addresses else target
    return targets


def _in_parallel(function: Callable[[str], dict[str, Any]], hosts: Sequence[str]) -> dict[str, dict[str, Any]]:
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return dict(zip(hosts, pool.map(function, hosts), strict=True))


def collect(hosts: list[str] | None, ssh_options: SshOptions | None = None, quick: bool = False) -> DoctorReport:
    """Probe ``hosts`` (None or empty: this host only) and derive the checks; ``quick`` skips the peer tests."""
    options = ssh_options or SshOptions()
    names = list(dict.fromkeys(hosts or []))
    if not names:
        local_data = doctor_probe.probe(quick=quick)
        name = local_data.get("hostname") or socket.gethostname()
        local_data["probed"] = "in-process"
        return DoctorReport({name: local_data}, derive_checks({name: local_data}))
    local = {name: is_local_host(name) for name in names}
    data: dict[str, dict[str, Any]] = {}
    if any(local.values()):
        local_data = {**doctor_probe.probe(quick=True), "probed": "in-process"}
        data.update({name: dict(local_data) for name in names if local[name]})
    remote = [name for name in names if not local[name]]
    for name, result in _in_parallel(lambda host: probe_remote(host, options, quick=quick), remote).items():
        data[name] = {**result, "probed": "ssh"}
    data = {name: data[name] for name in names}
    if not quick and len(names) > 1:
        _test_peers(names, data, local, options)
    return DoctorReport(data, derive_checks(data))


def _test_peers(names: Sequence[str], data: dict[str, dict[str, Any]], local: Mapping[str, bool],
                options: SshOptions) -> None:
    """Round 2: every reachable host tests TCP reachability of the others; results go to ``data[host]["peers"]``."""
    targets = {name: _peer_targets(name, names, data, local) for name in names if "error" not in data[name]}
    port = options.port if options.port is not None else doctor_probe.DEFAULT_PEER_PORT

    def test(source: str) -> dict[str, Any]:
        addresses = list(dict.fromkeys(targets[source].values()))
        if local[source]:
            return {"peers": doctor_probe.probe_peers(addresses, port)}
        return probe_remote(source, options, peers=addresses)

    sources = [name for name, wanted in targets.items() if wanted]
    for source, result in _in_parallel(test, sources).items():
        if "error" in result:
            data[source]["peers"] = {"error": f"peer test failed: {result['error']}"}
            continue
        peers = result.get("peers")
        if isinstance(peers, list):  # one entry per host, even where two hosts share an address
            by_address = {entry.get("address"): entry for entry in peers}
            peers = [{**by_address.get(address, {"address": address, "reachable": False, "error": "not tested"}),
                      "host": host} for host, address in targets[source].items()]
        data[source]["peers"] = peers
        data[source]["peers_skipped"] = False


# ---------------------------------------------------------------------------------------------- checks

def _gib(size: float) -> str:
    return f"{size / 1024**3:.1f} GiB" if size >= 1024**3 else f"{size / 1024**2:.0f} MiB"


def _unprobed_checks(host: str, data: Mapping[str, Any]) -> list[Check]:
    kind, error = data.get("error_kind", "unreachable"), str(data["error"])
    if kind == "torchring_missing":
        return [Check(host, "torchring importable", False, True, error,
                      INSTALL_FIX.format(what="torchring", python="the remote Python"))]
    if kind == "torch_broken":
        return [Check(host, "torch importable", False, True, error,
                      INSTALL_FIX.format(what="torch", python="the remote Python"))]
    if kind == "probe_failed":
        return [Check(host, "probe", False, True, error,
                      "run `python -m torchring.diagnostics.doctor.probe` on that host to see the whole error")]
    return [Check(host, "reachable over SSH", False, True, error, UNREACHABLE_FIX.format(host=host))]


def _import_checks(host: str, data: Mapping[str, Any]) -> list[Check]:
    python = f"Python {data.get('python')} ({data.get('python_executable', 'python')})"
    checks = []
    for module in ("torch", "torchring"):
        version = data.get(module)
        if version:
            checks.append(Check(host, f"{module} importable", True, True, f"{module} {version}"))
        else:
            error = data.get(f"{module}_error") or "not found"
            checks.append(Check(host, f"{module} importable", False, True, f"{python} cannot import it: {error}",
                                INSTALL_FIX.format(what=module, python=python)))
    return checks


def _gloo_check(host: str, data: Mapping[str, Any]) -> Check:
    available, error = data.get("gloo_available"), data.get("gloo_available_error")
    if available is True:
        return Check(host, "gloo", True, True, "torch.distributed has the Gloo backend")
    detail = f"cannot tell: {error}" if error else "this torch build has no Gloo backend"
    return Check(host, "gloo", False, True, detail + " (torchring needs it for CPU tensors and coordination)",
                 "install an official torch wheel (pip install torch), which includes Gloo")


def _cuda_checks(host: str, cuda: Any) -> list[Check]:
    if not isinstance(cuda, Mapping):
        return [Check(host, "cuda", False, False, f"cannot tell: {cuda!r}")]
    driver = cuda.get("driver_version")
    if cuda.get("error") and not str(cuda["error"]).startswith("torch cannot be imported"):
        return [Check(host, "cuda", False, False, f"probing CUDA failed: {cuda['error']}",
                      "check the GPU driver with nvidia-smi; until then training runs on CPU")]
    if not cuda.get("available"):
        if driver:
            return [Check(host, "cuda", False, False,
                          f"nvidia-smi reports driver {driver}, but torch cannot use the GPU "
                          f"(torch CUDA runtime: {cuda.get('cuda_runtime') or 'none, a CPU-only build'}); "
                          "training runs on CPU with Gloo",
                          "install a CUDA build of torch that this driver supports (see pytorch.org)")]
        return [Check(host, "cuda", True, False, NO_GPU_DETAIL)]
    devices = cuda.get("devices") or []
    names = ", ".join(sorted(set(devices))) if devices else "unknown"
    detail = (f"{cuda.get('device_count')} GPU(s) ({names}); driver {driver or 'unknown'}, CUDA runtime "
              f"{cuda.get('cuda_runtime')}, cuDNN {cuda.get('cudnn')}")
    checks = [Check(host, "cuda", True, False, detail)]
    if cuda.get("nccl_version"):
        checks.append(Check(host, "nccl", True, False, f"NCCL {cuda['nccl_version']}"))
    else:
        checks.append(Check(host, "nccl", False, False,
                            f"torch has no NCCL ({cuda.get('nccl_version_error') or 'not built in'}); GPU "
                            "tensors will be reduced through Gloo, much slower",
                            "install a torch build with NCCL (the official CUDA wheels have it)"))
    return checks


def _shm_check(host: str, shm: Any) -> Check:
    if not isinstance(shm, Mapping) or shm.get("total_bytes") is None:
        error = shm.get("error") if isinstance(shm, Mapping) else shm
        return Check(host, "/dev/shm", False, False, f"cannot measure /dev/shm: {error}", SHM_FIX)
    total = shm["total_bytes"]
    if shm.get("ok"):
        return Check(host, "/dev/shm", True, False, f"{_gib(total)}")
    return Check(host, "/dev/shm", False, False,
                 f"only {_gib(total)} (under 1 GiB): DataLoader workers and NCCL run out of shared memory", SHM_FIX)


def _interfaces_check(host: str, interfaces: Any) -> Check:
    if not isinstance(interfaces, list):
        return Check(host, "network interfaces", False, False, f"cannot list them: {interfaces}")
    text = ", ".join(f"{entry['name']} {entry['ipv4']}" for entry in interfaces) or "no interface has IPv4"
    return Check(host, "network interfaces", True, False, text)


def _peers_check(host: str, data: Mapping[str, Any]) -> Check | None:
    peers = data.get("peers")
    if isinstance(peers, Mapping):
        return Check(host, "reaches peers", False, True, str(peers.get("error")), PEERS_FIX)
    if not peers:
        return None
    failed = [p for p in peers if not p.get("reachable")]
    port = peers[0].get("port", doctor_probe.DEFAULT_PEER_PORT)
    if not failed:
        listed = ", ".join(f"{p.get('host', p['address'])} ({p['address']})" for p in peers)
        return Check(host, "reaches peers", True, True, f"TCP {port} answers on {listed}")
    listed = "; ".join(f"{p.get('host', p['address'])} at {p['address']}:{p.get('port', port)} "
                       f"({p.get('error', 'unreachable')})" for p in failed)
    return Check(host, "reaches peers", False, True, f"cannot reach {listed}", PEERS_FIX)


def _info_checks(host: str, data: Mapping[str, Any]) -> list[Check]:
    rdma = data.get("rdma")
    if isinstance(rdma, list):
        rdma_text = ", ".join(rdma) if rdma else "none (NCCL and Gloo use TCP sockets)"
    else:
        rdma_text = f"cannot tell: {rdma}"
    container = data.get("container")
    if isinstance(container, Mapping) and "runtime" in container:
        container_text = f"{container['runtime']} ({container.get('evidence')})"
    else:
        container_text = "not in a container" if container is None else f"cannot tell: {container}"
    settings = data.get("settings")
    if isinstance(settings, Mapping):
        settings_text = ", ".join(f"{k}={v}" for k, v in settings.items()) or "none set"
    else:
        settings_text = f"cannot tell: {settings}"
    return [Check(host, "rdma", True, False, rdma_text), Check(host, "container", True, False, container_text),
            Check(host, "settings", True, False, settings_text)]


def host_checks(host: str, data: Mapping[str, Any]) -> list[Check]:
    """The checks of one host from its raw probe dict (or its ``{"error": ...}``)."""
    if "error" in data:
        return _unprobed_checks(host, data)
    checks = [Check(host, "python", True, False, f"Python {data.get('python')} ({data.get('python_executable')})")]
    checks += _import_checks(host, data)
    if data.get("torch"):
        checks.append(_gloo_check(host, data))
    checks += _cuda_checks(host, data.get("cuda"))
    checks.append(_shm_check(host, data.get("shm")))
    checks.append(_interfaces_check(host, data.get("interfaces")))
    peers = _peers_check(host, data)
    if peers is not None:
        checks.append(peers)
    return checks + _info_checks(host, data)


def _version_checks(hosts: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    """Python, torch and torchring must be the same everywhere; NCCL should be."""
    probed = {host: data for host, data in hosts.items() if "error" not in data}
    if len(probed) < 2:
        return []
    checks = []
    for key, label in (("python", "Python"), ("torch", "torch"), ("torchring", "torchring")):
        found = {host: data.get(key) for host, data in probed.items()}
        if len(set(found.values())) > 1:
            listed = ", ".join(f"{host} {version}" for host, version in found.items())
            checks.append(Check(ALL_HOSTS, f"{label} versions", False, True,
                                f"hosts differ ({listed}); `torchring run` refuses to start them",
                                f"install the same {label} version on every host, or pass --python"))
        else:
            checks.append(Check(ALL_HOSTS, f"{label} versions", True, True,
                                f"{label} {next(iter(found.values()))} on all {len(found)} hosts"))
    nccl = {host: data["cuda"].get("nccl_version") for host, data in probed.items()
            if isinstance(data.get("cuda"), Mapping) and data["cuda"].get("available")}
    if len(set(nccl.values())) > 1:
        listed = ", ".join(f"{host} {version}" for host, version in nccl.items())
        checks.append(Check(ALL_HOSTS, "NCCL versions", False, False,
                            f"GPU hosts have different NCCL versions ({listed}); collectives may hang or fail",
                            "install the same torch build (hence NCCL) on every GPU host"))
    return checks


def derive_checks(hosts: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    """Every check, host by host in the order given, then those comparing hosts."""
    checks: list[Check] = []
    for host, data in hosts.items():
        checks += host_checks(host, data)
    return checks + _version_checks(hosts)
