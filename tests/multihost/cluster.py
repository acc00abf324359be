"""A throw-away multi-host cluster on one machine, for tests that launch jobs over real SSH.

Each fake host ``hI`` is a network namespace ``trhI`` joined to the bridge ``trbr0`` by a veth pair
(``tr-hI`` in the root namespace, ``eth0`` inside), with address ``10.78.0.(I+1)/24`` and no default
route. Each host runs its own ``sshd`` inside its namespace plus a private UTS namespace (so
``hostname`` prints ``hI``) and a private mount namespace in which a shared ``hosts`` file and an
empty ``resolv.conf`` are bind-mounted over ``/etc/hosts`` and ``/etc/resolv.conf``. Every ssh
session inherits all three namespaces, so ``ssh h2 hostname`` prints ``h2`` and ``h1`` resolves
to ``10.78.0.2`` from every host without DNS. The file system is shared, so a remote command can
run this checkout's virtual environment.

Clients reach the hosts through an ``ssh`` wrapper in :attr:`Cluster.bin_dir` that adds ``-F``
with the cluster's own client config; put it first in ``PATH`` (see :meth:`Cluster.env`) and a
launcher's plain ``ssh h2 ...`` lands on the fake host. Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN),
iproute2, openssh-server, openssh-client and util-linux.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

#: Which cluster this process builds: 0 (the default) or another small number, so that two pytest runs
#: (``make test`` runs two groups of multi-host tests at once) each have a cluster of their own. Cluster
#: 0 is ``trbr0``/``10.78.0.0/24``/``trhI``; cluster ``K`` is ``trbrK``/``10.(78+K).0.0/24``/``trKhI``.
#: The host names are ``h1``.. in every cluster (each has its own ssh config and /etc/hosts).
CLUSTER_INDEX = int(os.environ.get("TORCHRING_TEST_CLUSTER", "0"))
if not 0 <= CLUSTER_INDEX <= 9:
    raise ValueError(f"TORCHRING_TEST_CLUSTER must be 0..9, not {CLUSTER_INDEX}")
BRIDGE = f"trbr{CLUSTER_INDEX}"
NETWORK = f"10.{78 + CLUSTER_INDEX}.0"
GATEWAY = f"{NETWORK}.1"
PREFIX_LENGTH = 24
NAMESPACE_PREFIX = "trh" if CLUSTER_INDEX == 0 else f"tr{CLUSTER_INDEX}h"
VETH_PREFIX = "tr-h" if CLUSTER_INDEX == 0 else f"tr{CLUSTER_INDEX}-h"
#: Every test cluster's namespaces, this one's and the others' (see :data:`CLUSTER_INDEX`).
_ANY_CLUSTER_NAMESPACE = r"tr\d?h\d+"
SSHD = "/usr/sbin/sshd"
SSH = "/usr/bin/ssh"
RUN_SSHD = Path("/run/sshd")
unreachable_address = f"{NETWORK}.250"
"""An address on the cluster's subnet that no host answers (for connect-timeout tests)."""

_CAP_NET_ADMIN = 12
_CAP_SYS_ADMIN = 21


class ClusterUnavailable(Exception):
    """This machine cannot host the test cluster; ``str(error)`` says why in one line."""


@dataclass
class Host:
    """One fake host: its ssh/host name (``h1``), address (``10.78.0.2``) and network namespace (``trh1``)."""

    name: str
    address: str
    namespace: str


def _run(argv: list[str], check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a setup command, raising with its stderr when ``check`` and it fails."""
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def _has_capabilities(*bits: int) -> bool:
    """Whether this process has all the given capabilities in its effective set."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return True  # cannot tell; let the real commands decide
    match = re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.MULTILINE)
    if match is None:
        return True
    effective = int(match.group(1), 16)
    return all(effective >> bit & 1 for bit in bits)


def cluster_unavailable_reason() -> str | None:
    """None when this machine can host a :class:`Cluster`, otherwise a one-line reason why not."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if not _has_capabilities(_CAP_NET_ADMIN, _CAP_SYS_ADMIN):
        return "needs CAP_NET_ADMIN and CAP_SYS_ADMIN (network and mount namespaces)"
    if shutil.which("ip") is None:
        return "iproute2 is not installed (apt-get install -y iproute2)"
    if not os.path.exists(SSHD):
        return "openssh-server is not installed (apt-get install -y openssh-server)"
    if not os.path.exists(SSH) or shutil.which("ssh-keygen") is None:
        return "openssh-client is not installed (apt-get install -y openssh-client)"
    if shutil.which("unshare") is None:
        return "util-linux is not installed (apt-get install -y util-linux)"
    try:
        result = _run(["ip", "netns", "list"], check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"`ip netns list` does not work: {error}"
    if result.returncode != 0:
        return f"`ip netns list` does not work: {result.stderr.strip() or result.returncode}"
    return None


def _namespaces() -> list[str]:
    """Names of all network namespaces that ``ip netns`` knows."""
    output = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in output.splitlines() if line.strip()]


def _namespace_pids(namespace: str) -> list[int]:
    """PIDs of the processes whose network namespace is ``namespace`` (empty if it does not exist)."""
    result = _run(["ip", "netns", "pids", namespace], check=False)
    return [int(word) for word in result.stdout.split() if word.isdigit()]


def _link_exists(name: str) -> bool:
    return _run(["ip", "link", "show", "dev", name], check=False).returncode == 0


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _empty_namespace(namespace: str, keep: int | None = None, graceful: bool = True) -> list[int]:
    """Kill every process in ``namespace`` but ``keep``: SIGTERM for a while when ``graceful``, then SIGKILL.

    Only processes started by the cluster (or by ssh sessions into it) can live in our namespaces,
    so everything found there is ours. Returns the PIDs still left after about 5 seconds.
    """
    signals = [signal.SIGTERM] * 5 if graceful else []
    signals += [signal.SIGKILL] * 20
    for sig in signals:
        pids = [pid for pid in _namespace_pids(namespace) if pid != keep]
        if not pids:
            return []
        _signal(pids, sig)
        time.sleep(0.2)
    return [pid for pid in _namespace_pids(namespace) if pid != keep]


def _remove_network(namespaces: list[str]) -> None:
    """Kill everything in ``namespaces``, then delete them, their veths and the bridge (errors ignored)."""
    for namespace in namespaces:
        if namespace in _namespaces():
            _empty_namespace(namespace)
            _run(["ip", "netns", "del", namespace], check=False)
    for line in _run(["ip", "-o", "link", "show"], check=False).stdout.splitlines():
        match = re.match(rf"^\d+:\s+({re.escape(VETH_PREFIX)}\d+)[@:]", line)
        if match:
            _run(["ip", "link", "del", "dev", match.group(1)], check=False)
    if _link_exists(BRIDGE):
        _run(["ip", "link", "del", "dev", BRIDGE], check=False)


#: The rule that lets hosts talk to each other across the bridge when a firewall drops forwarded
#: packets. Docker's engine sets the FORWARD policy to DROP and loads br_netfilter, so frames bridged
#: between two hosts of this cluster pass through iptables' FORWARD chain and would be dropped.
_FORWARD_RULE = ["FORWARD", "-i", BRIDGE, "-o", BRIDGE, "-j", "ACCEPT"]


def _allow_forwarding_on_the_bridge() -> bool:
    """Put :data:`_FORWARD_RULE` first in FORWARD when bridged frames go through iptables; True if added."""
    nf_call = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    if shutil.which("iptables") is None or not nf_call.exists() or nf_call.read_text().strip() != "1":
        return False
    if _run(["iptables", "-C", *_FORWARD_RULE], check=False).returncode == 0:
        return True  # left by a run that crashed: this one removes it
    return _run(["iptables", "-I", *_FORWARD_RULE], check=False).returncode == 0


def _remove_forwarding_rule() -> None:
    while _run(["iptables", "-D", *_FORWARD_RULE], check=False).returncode == 0:
        pass


def _our_namespaces() -> list[str]:
    """Existing namespaces that look like ours (``trh<N>``), e.g. left over by a crashed run."""
    return [name for name in _namespaces() if re.fullmatch(rf"{NAMESPACE_PREFIX}\d+", name)]


class Cluster:
    """A running set of fake hosts; create with :meth:`Cluster.start`, tear down with :meth:`stop`."""

    def __init__(self, state_dir: Path, hosts: list[Host]) -> None:
        self.state_dir = state_dir
        self.hosts = hosts
        self.ssh_config = state_dir / "ssh_config"
        self.known_hosts = state_dir / "known_hosts"
        self.identity_file = state_dir / "id_ed25519"
        self.authorized_keys = state_dir / "authorized_keys"
        self.hosts_file = state_dir / "hosts"
        self.resolv_conf = state_dir / "resolv.conf"
        self.bin_dir = state_dir / "bin"
        self._created_run_sshd = False
        self._added_forward_rule = False

    # ------------------------------------------------------------------ set-up

    @classmethod
    def start(cls, state_dir: Path, num_hosts: int, mtu: int = 1500) -> Cluster:
        """Build a cluster of ``num_hosts`` hosts (``h1``..) with state under ``state_dir`` and wait until ssh works.

        Leftovers of an earlier run with the same names (namespaces, veths, bridge) are removed
        first. On failure the half-built cluster is torn down again before the error propagates.
        Raises :class:`ClusterUnavailable` when the machine cannot host it.
        """
        reason = cluster_unavailable_reason()
        if reason is not None:
            raise ClusterUnavailable(reason)
        if not 1 <= num_hosts <= 200:
            raise ValueError(f"num_hosts must be in 1..200, not {num_hosts}")
        state_dir = Path(state_dir).resolve()
        state_dir.mkdir(parents=True, exist_ok=True)
        hosts = [Host(f"h{i}", f"{NETWORK}.{i + 1}", f"{NAMESPACE_PREFIX}{i}") for i in range(1, num_hosts + 1)]
        cluster = cls(state_dir, hosts)
        _remove_network(_our_namespaces())
        try:
            cluster._write_client_files()
            cluster._make_network(mtu)
            for host in hosts:
                cluster._start_sshd(host)
            for host in hosts:
                cluster._wait_for_sshd(host)
            for host in hosts:
                cluster._check_login(host)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _write_client_files(self) -> None:
        """Client key, authorized_keys, ssh config, the ``ssh`` wrapper and the shared /etc files."""
        if not RUN_SSHD.is_dir():  # sshd's privilege-separation directory, normally made by systemd
            RUN_SSHD.mkdir(mode=0o755)
            self._created_run_sshd = True
        if not self.identity_file.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "torchring-test", "-f", str(self.identity_file)])
        self.authorized_keys.write_text(self.identity_file.with_suffix(".pub").read_text())
        self.authorized_keys.chmod(0o600)
        self.known_hosts.touch()

        lines = []
        for host in self.hosts:
            lines += [f"Host {host.name}", f"  HostName {host.address}"]
        lines += [
            f"Host h* {NETWORK}.*",
            "  User root",
            f"  IdentityFile {self.identity_file}",
            "  IdentitiesOnly yes",
            "  StrictHostKeyChecking no",
            f"  UserKnownHostsFile {self.known_hosts}",
            "  BatchMode yes",
            "  LogLevel ERROR",
            "  ConnectTimeout 5",
        ]
        self.ssh_config.write_text("\n".join(lines) + "\n")

        self.bin_dir.mkdir(exist_ok=True)
        wrapper = self.bin_dir / "ssh"
        wrapper.write_text(
            "#!/bin/sh\n"
            "# put this directory first in PATH to send a plain `ssh h2 ...` to the test cluster\n"
            f"exec {SSH} -F {shlex.quote(str(self.ssh_config))} \"$@\"\n"
        )
        wrapper.chmod(0o755)

        entries = ["127.0.0.1 localhost", "::1 localhost ip6-localhost ip6-loopback"]
        entries += [f"{host.address} {host.name}" for host in self.hosts]
        self.hosts_file.write_text("\n".join(entries) + "\n")
        self.resolv_conf.write_text("# torchring test cluster: no DNS\n")

    def _make_network(self, mtu: int) -> None:
        """The bridge in the root namespace, then one namespace + veth pair + address per host."""
        try:
            _run(["ip", "link", "add", BRIDGE, "type", "bridge", "stp_state", "0"])
        except RuntimeError as error:
            raise ClusterUnavailable(f"cannot create bridge {BRIDGE}: {error}") from error
        _run(["ip", "addr", "add", f"{GATEWAY}/{PREFIX_LENGTH}", "dev", BRIDGE])
        _run(["ip", "link", "set", BRIDGE, "mtu", str(mtu), "up"])
        for host in self.hosts:
            veth = f"{VETH_PREFIX}{host.name[1:]}"
            try:
                _run(["ip", "netns", "add", host.namespace])
            except RuntimeError as error:
                raise ClusterUnavailable(f"cannot create network namespaces: {error}") from error
            _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host.namespace])
            _run(["ip", "link", "set", veth, "mtu", str(mtu), "master", BRIDGE, "up"])
            _run(["ip", "-n", host.namespace, "link", "set", "lo", "up"])
            _run(["ip", "-n", host.namespace, "addr", "add", f"{host.address}/{PREFIX_LENGTH}", "dev", "eth0"])
            _run(["ip", "-n", host.namespace, "link", "set", "eth0", "mtu", str(mtu), "up"])
        _run(["ip", "link", "set", BRIDGE, "mtu", str(mtu)])  # a bridge follows its smallest port; pin it
        self._added_forward_rule = _allow_forwarding_on_the_bridge()

    def host_dir(self, host: Host | str) -> Path:
        """Where a host's sshd config, host key, pid file and log live."""
        return self.state_dir / self.host(host).name

    def _start_sshd(self, host: Host) -> None:
        """Write the host's sshd config and start sshd inside its namespaces (sshd daemonizes itself)."""
        directory = self.host_dir(host)
        directory.mkdir(exist_ok=True)
        host_key = directory / "ssh_host_ed25519_key"
        if not host_key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", host.name, "-f", str(host_key)])
        config = directory / "sshd_config"
        config.write_text("\n".join([
            f"ListenAddress {host.address}",
            "Port 22",
            f"HostKey {host_key}",
            f"PidFile {directory / 'sshd.pid'}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "# the state directory lives under a world-writable tmp dir, which StrictModes rejects",
            "StrictModes no",
            "UseDNS no",
            "PrintMotd no",
            "MaxStartups 200:30:400",
            "MaxSessions 200",
            "AcceptEnv LANG LC_*",
        ]) + "\n")
        (directory / "sshd.pid").unlink(missing_ok=True)
        script = (
            'hostname "$1" && mount --bind "$2" /etc/hosts && mount --bind "$3" /etc/resolv.conf && '
            f'exec {SSHD} -f "$4" -E "$5"'
        )
        argv = [
            "ip", "netns", "exec", host.namespace, "unshare", "--uts", "--mount", "--propagation", "private",
            "/bin/sh", "-c", script, "sh", host.name, str(self.hosts_file), str(self.resolv_conf), str(config),
            str(directory / "sshd.log"),
        ]
        with open(directory / "start.log", "w") as log:
            result = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=30)
        if result.returncode != 0:
            raise RuntimeError(f"starting sshd for {host.name} failed ({result.returncode}): {self._logs(host)}")

    def _logs(self, host: Host) -> str:
        directory = self.host_dir(host)
        texts = []
        for name in ("start.log", "sshd.log"):
            try:
                text = (directory / name).read_text().strip()
            except OSError:
                continue
            if text:
                texts.append(f"{name}: {text[-2000:]}")
        return "; ".join(texts) or "(no log output)"

    def sshd_pid(self, host: Host | str) -> int | None:
        """PID of the host's sshd listener, if its pid file names a live process in the host's namespace."""
        host = self.host(host)
        try:
            pid = int((self.host_dir(host) / "sshd.pid").read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if pid in _namespace_pids(host.namespace) else None

    def _wait_for_sshd(self, host: Host, timeout: float = 5.0) -> None:
        """Wait until the host's sshd is alive and accepts TCP connections on port 22."""
        deadline = time.monotonic() + timeout
        while True:
            if self.sshd_pid(host) is not None:
                try:
                    socket.create_connection((host.address, 22), timeout=0.5).close()
                    return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"sshd for {host.name} did not accept connections within {timeout} s: "
                                   f"{self._logs(host)}")
            time.sleep(0.05)

    def _check_login(self, host: Host) -> None:
        """Log in once through the wrapper: proves keys, config and the host's own hostname."""
        result = self.run_on(host, "hostname", timeout=15)
        if result.returncode != 0 or result.stdout.strip() != host.name:
            raise RuntimeError(f"`ssh {host.name} hostname` gave rc={result.returncode} stdout={result.stdout!r} "
                               f"stderr={result.stderr.strip()!r}; {self._logs(host)}")

    # ------------------------------------------------------------------ use

    def host(self, host: Host | str) -> Host:
        """The :class:`Host` for a host or its name (``"h1"``)."""
        if isinstance(host, Host):
            return host
        for candidate in self.hosts:
            if candidate.name == host:
                return candidate
        raise KeyError(f"no host named {host!r} in this cluster")

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A copy of ``base`` (default ``os.environ``) with :attr:`bin_dir` first in ``PATH`` and one OpenMP
        thread per rank unless ``base`` sets ``OMP_NUM_THREADS``: every namespace host shares this machine's
        cores, so the launcher's per-host default (cores / ranks on the host) would oversubscribe them."""
        env = dict(os.environ if base is None else base)
        env.setdefault("OMP_NUM_THREADS", "1")
        env["PATH"] = os.pathsep.join(part for part in (str(self.bin_dir), env.get("PATH", "")) if part)
        return env

    def ssh_command(self, host: Host | str, *argv: str) -> list[str]:
        """``ssh <host> -- '<quoted argv>'`` through the cluster's wrapper, as an argv list."""
        return [str(self.bin_dir / "ssh"), self.host(host).name, "--", shlex.join(argv)]

    def run_on(self, host: Host | str, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``host`` over ssh and return the finished process (text output, never raises on rc)."""
        return subprocess.run(self.ssh_command(host, *argv), stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, timeout=timeout)

    def pids_in(self, host: Host | str) -> list[int]:
        """PIDs of the processes on ``host`` other than its sshd listener (ssh sessions and what they started)."""
        host = self.host(host)
        listener = self.sshd_pid(host)
        return [pid for pid in _namespace_pids(host.namespace) if pid != listener]

    def wait_until_empty(self, host: Host | str, timeout: float = 5.0) -> list[int]:
        """Poll until :meth:`pids_in` is empty or ``timeout`` passes; return what is left (``[]`` when empty)."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.pids_in(host)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.05)

    def cut_off(self, host: Host | str) -> None:
        """Drop every packet into and out of ``host`` (a network partition: no reset, no error, silence).
        Needs ``nft`` (nftables); undo with :meth:`reconnect`."""
        namespace = self.host(host).namespace
        rules = ("table inet torchring_cut {\n"
                 "  chain input { type filter hook input priority 0; policy drop; }\n"
                 "  chain output { type filter hook output priority 0; policy drop; }\n"
                 "}\n")
        subprocess.run(["ip", "netns", "exec", namespace, "nft", "-f", "-"], input=rules, text=True, check=True,
                       capture_output=True, timeout=30)

    def reconnect(self, host: Host | str) -> None:
        """Undo :meth:`cut_off`."""
        _run(["ip", "netns", "exec", self.host(host).namespace, "nft", "delete", "table", "inet", "torchring_cut"],
             check=False)

    def kill_all_in(self, host: Host | str) -> list[int]:
        """SIGKILL every process on ``host`` except its sshd listener; return any PIDs that would not die."""
        host = self.host(host)
        return _empty_namespace(host.namespace, keep=self.sshd_pid(host), graceful=False)

    # ------------------------------------------------------------------ tear-down

    def stop(self) -> None:
        """Kill everything on every host (sshd included), delete namespaces, veths and bridge, undo /run/sshd."""
        _remove_network([host.namespace for host in self.hosts] + _our_namespaces())
        if self._added_forward_rule:
            _remove_forwarding_rule()
            self._added_forward_rule = False
        if self._created_run_sshd and not any(re.fullmatch(_ANY_CLUSTER_NAMESPACE, name) for name in _namespaces()):
            try:  # another test cluster's sshd still needs it
                RUN_SSHD.rmdir()
            except OSError:
                pass
            self._created_run_sshd = False
