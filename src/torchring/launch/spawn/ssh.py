"""SSH for ``torchring run -H``: the commands, the preflight checks, and starting remote ranks. Inside
a Slurm allocation the same commands start through ``srun`` instead (``SshOptions.transport``).

Every remote command line is built with ``shlex`` from a fixed program and arguments; what varies
per job (the user's command, its arguments, the environment, the working directory) travels as JSON
on the SSH channel's standard input (see ``remote_rank``), so nothing of it is ever parsed by a
remote shell.
"""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ...network import route_source
from .local import _die_with_launcher
from .remote_link import LINK_TIMEOUT_S


@dataclass(frozen=True)
class SshOptions:
    """How to reach the remote hosts."""

    port: int | None = None
    identity_file: str | None = None
    connect_timeout_s: float = 30.0
    #: The interpreter to run on remote hosts (the launcher's by default).
    python: str = "python3"
    #: How remote commands start: ``ssh``, or ``srun`` (one job step per command, inside an allocation).
    transport: str = "ssh"

    @property
    def failure_name(self) -> str:
        """What failed when a remote command could not start, for messages (``SSH``, ``srun``)."""
        return "srun" if self.transport == "srun" else "SSH"


def remote_argv(host: str, argv: Sequence[str], options: SshOptions) -> list[str]:
    """The command that runs ``argv`` on ``host``: over SSH (``ssh_argv``), or as a one-task job step of
    the current Slurm allocation on that node, sharing the allocation's CPUs with the other steps, with
    this process's environment and its standard input passed on."""
    if options.transport != "srun":
        return ssh_argv(host, argv, options)
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--cpu-bind=none", "--quiet",
            "--input=all", "--export=ALL", "--kill-on-bad-exit=0", *argv]


def ssh_argv(host: str, remote_argv: Sequence[str], options: SshOptions) -> list[str]:
    """``ssh ... host -- 'quoted remote command'``: the remote shell sees one properly quoted line."""
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(options.connect_timeout_s))}",
            "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
    if options.port is not None:
        argv += ["-p", str(options.port)]
    if options.identity_file:
        argv += ["-i", options.identity_file]
    return [*argv, host, "--", shlex.join(remote_argv)]


#: The module preflight runs on each remote host (``host_probe``).
HOST_PROBE_MODULE = "torchring.launch.spawn.host_probe"


@dataclass(frozen=True)
class HostReport:
    """What preflight learned about one remote host, or why it could not."""

    host: str
    error: str | None = None
    python: str | None = None
    torch: str | None = None
    torchring: str | None = None
    interface: str | None = None
    cpus: int = 1
    #: The launcher's address as this host sees it: where its ranks find the rendezvous store.
    launcher_address: str | None = None
    store_reachable: bool = False
    store_error: str | None = None
    #: The host has NVIDIA GPUs (containers there get ``--gpus all`` unless ``--image-no-gpus``).
    nvidia_gpus: bool = False

    @property
    def versions(self) -> tuple[str | None, str | None, str | None]:
        return (self.python, self.torch, self.torchring)


def _last_lines(text: str, count: int = 3) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:]) if lines else "no message"


def probe_host(host: str, store_port: int, store_address: str, options: SshOptions) -> HostReport:
    """Run ``host_probe`` on ``host`` over SSH (bounded by the start timeout). ``store_address``
    "" means: the launcher's address as seen from ``host``."""
    if not store_address and options.transport == "srun":  # no SSH_CONNECTION there to tell it
        destination = destination_address(host, options)
        store_address = (route_source(destination) if destination else None) or ""
    remote = [options.python, "-m", HOST_PROBE_MODULE, str(store_port), str(min(5.0, options.connect_timeout_s)),
              store_address]
    try:
        result = subprocess.run(remote_argv(host, remote, options), stdin=subprocess.DEVNULL, capture_output=True,
                                text=True, timeout=options.connect_timeout_s, preexec_fn=_die_with_launcher)
    except subprocess.TimeoutExpired:
        return HostReport(host, error=f"no answer over {options.failure_name} within {options.connect_timeout_s:g} s "
                                      "(--start-timeout)")
    except FileNotFoundError:
        client = "srun (slurm-client)" if options.transport == "srun" else "the ssh client (openssh-client)"
        return HostReport(host, error=f"{client} is not installed on this machine")
    if result.returncode == 255 or (options.transport == "srun" and result.stderr.startswith("srun: error")):
        return HostReport(host, error=f"{options.failure_name} failed: {_last_lines(result.stderr)}")
    if "No module named 'torchring" in result.stderr:
        return HostReport(host, error=f"torchring is not installed for {options.python} there (or is a version "
                                      f"without {HOST_PROBE_MODULE}): install the same torchring as here, or "
                                      "point --python at an interpreter that has it")
    if result.returncode != 0:
        return HostReport(host, error=f"{options.python} failed there (exit {result.returncode}): "
                                      f"{_last_lines(result.stderr)}")
    try:
        data = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return HostReport(host, error=f"unexpected preflight output: {_last_lines(result.stdout + result.stderr)}")
    return HostReport(host, python=data.get("python"), torch=data.get("torch"), torchring=data.get("torchring"),
                      interface=data.get("interface"), cpus=int(data.get("cpus") or 1),
                      launcher_address=data.get("launcher_address") if not store_address else store_address,
                      store_reachable=bool(data.get("store_reachable")), store_error=data.get("store_error"),
                      nvidia_gpus=bool(data.get("nvidia_gpus")))


def probe_hosts(hosts: Sequence[str], store_port: int, store_address: str,
                options: SshOptions) -> dict[str, HostReport]:
    """Preflight every host in parallel."""
    if not hosts:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        reports = list(pool.map(lambda host: probe_host(host, store_port, store_address, options), hosts))
    return {report.host: report for report in reports}


def preflight_problems(reports: Mapping[str, HostReport], local: tuple[str, str | None, str | None]) -> list[str]:
    """Every reason the job would fail, one line each (empty: go ahead)."""
    problems = [f"host {host}: {report.error}" for host, report in reports.items() if report.error]
    usable = {host: report for host, report in reports.items() if not report.error}
    for host, report in usable.items():
        if report.torch is None or report.torchring is None:
            missing = " and ".join(name for name, version in (("torch", report.torch), ("torchring", report.torchring))
                                   if version is None)
            problems.append(f"host {host}: {missing} cannot be imported by its Python ({report.python}); install "
                            "them there or pass --python")
    mismatched = {host: r for host, r in usable.items() if r.versions != local and None not in r.versions}
    if mismatched:
        lines = [f"  this host: Python {local[0]}, torch {local[1]}, torchring {local[2]}"]
        lines += [f"  {host}: Python {r.python}, torch {r.torch}, torchring {r.torchring}"
                  for host, r in mismatched.items()]
        problems.append("hosts run different versions; install the same Python, torch and torchring "
                        "everywhere (or pass --python):\n" + "\n".join(lines))
    for host, report in usable.items():
        if not report.store_reachable:
            problems.append(f"host {host} cannot reach the launcher's rendezvous store ({report.store_error}); "
                            "choose the interface the hosts share with --network-interface, or open that port "
                            "in the firewall")
    return problems


def destination_address(host: str, options: SshOptions) -> str | None:
    """The IPv4 address ``ssh host`` connects to (``ssh -G`` applies the user's ssh config, e.g. a
    ``HostName`` alias), None when it cannot tell or the connection goes through a proxy; through
    ``srun``, the address the node's name resolves to."""
    name = host
    if options.transport != "srun":
        argv = ["ssh", "-G", *(["-p", str(options.port)] if options.port is not None else []), host]
        try:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        config = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
        if result.returncode != 0 or config.get("proxyjump", "none") != "none" or "proxycommand" in config:
            return None
        name = config.get("hostname", host)
    try:
        return socket.getaddrinfo(name, None, socket.AF_INET)[0][4][0]
    except (OSError, IndexError):
        return None


def spawn_remote(host: str | None, python: str, options: SshOptions) -> subprocess.Popen:
    """Start ``remote_rank`` on ``host`` (its specification is written to stdin next); ``host`` None
    starts it on this host, without SSH."""
    remote_rank = [python, "-m", "torchring.launch.spawn.remote_rank"]
    argv = remote_rank if host is None else remote_argv(host, remote_rank, options)
    return subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_die_with_launcher)


def send_spec(process: subprocess.Popen, command: Sequence[str], env: Mapping[str, str], cwd: str,
              horovod_compat: bool, cleanup: Sequence[Sequence[str]] = (), probe: bool = False) -> None:
    """Give a remote rank its command, environment, working directory and the commands to run after
    it ends; keep the channel open. The supervisor answers pings (``remote_link``) and, with ``probe``,
    stack samples of the rank."""
    assert process.stdin is not None
    spec = {"command": list(command), "env": dict(env), "cwd": cwd, "horovod_compat": horovod_compat,
            "cleanup": [list(c) for c in cleanup], "link_timeout_s": LINK_TIMEOUT_S, "probe": probe}
    process.stdin.write((json.dumps(spec) + "\n").encode())
    process.stdin.flush()
