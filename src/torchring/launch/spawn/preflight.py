"""Preflight of remote hosts, the same for fixed and elastic jobs: SSH works, the versions match this
host's, and the host reaches the launcher's rendezvous store (at ``--network-interface``'s address, or
where its SSH connection came from)."""

from __future__ import annotations

import platform
from collections.abc import Callable, Sequence

from ...network import address_of
from ...version import __version__
from .host_probe import installed_version
from .ssh import HostReport, SshOptions, preflight_problems, probe_hosts


class PreflightError(RuntimeError):
    """Preflight found reasons the job would fail; nothing was started."""


def local_versions() -> tuple[str, str, str]:
    """This host's Python, torch and torchring versions, which every remote host must match; torch's is read
    as the hosts read theirs (``host_probe``), without importing torch, which costs the launcher seconds of CPU
    on a busy machine."""
    torch_version, error = installed_version("torch")
    if torch_version is None:
        raise PreflightError(f"torch is not usable on this machine ({error}): install it before launching")
    return platform.python_version(), torch_version, __version__


def store_address(network_interfaces: Sequence[str]) -> str:
    """Where remote hosts reach the store: the first ``--network-interface``'s address, or "" for the
    launcher's address as each host sees it."""
    return address_of(network_interfaces[0]) if network_interfaces else ""


def check_hosts(hosts: Sequence[str], store_port: int, network_interfaces: Sequence[str], ssh: SshOptions,
                log: Callable[[str], None] | None = None) -> tuple[dict[str, HostReport], list[str]]:
    """Preflight ``hosts`` in parallel: their reports, and every problem found, one line each."""
    if log is not None:
        log(f"preflight on {', '.join(hosts)} (timeout {ssh.connect_timeout_s:g} s)")
    reports = probe_hosts(list(hosts), store_port, store_address(network_interfaces), ssh)
    return reports, preflight_problems(reports, local_versions())


def require_hosts(hosts: Sequence[str], store_port: int, network_interfaces: Sequence[str], ssh: SshOptions,
                  log: Callable[[str], None] | None = None) -> dict[str, HostReport]:
    """Preflight ``hosts``; ``PreflightError`` listing every problem when any host fails a check."""
    reports, problems = check_hosts(hosts, store_port, network_interfaces, ssh, log)
    if problems:
        raise PreflightError("preflight failed, no rank was started:\n" + "\n".join(f"- {p}" for p in problems))
    return reports
