"""One spawner for fixed and elastic jobs: "process N on host H with these variables" becomes a running
process whose output is relayed and which can be stopped as a whole.

Where a process runs decides how it starts (:class:`~torchring.launch.spawn.rank_env.Placement`):

* on this host, the command itself in a session of its own (:func:`~torchring.launch.spawn.local.spawn_local`),
  with the Horovod shim first on ``PYTHONPATH`` under ``--horovod-compat``;
* on a remote host, the ``remote_rank`` supervisor over SSH, which gets the command, the environment and
  the working directory as JSON on its standard input (and adds the shim there);
* with ``--image``, ``remote_rank`` (over SSH, or directly on this host) runs ``docker run ... IMAGE
  COMMAND`` with the environment as ``-e`` values (the job's secret as ``-e NAME`` alone, its value in
  the docker client's environment, so that it never shows on a command line), and ``docker stop`` when
  the process must end.

Every process started under ``remote_rank`` gets a :class:`~torchring.launch.spawn.remote_link.RemoteLink`:
a heartbeat both ways (a host cut off from the launcher ends its processes; the launcher names the host)
and, over SSH with the hang detector on, stack samples. Local processes get a
:class:`~torchring.launch.sampling.stack_probe.StackProbe` instead.

Either way its output is prefixed with its label (``[3]`` for rank 3, ``[w3]`` for elastic worker w3),
shown or not (``--ranks``) and, with ``--output-filename DIR``, also written to ``DIR/rank.3/`` or
``DIR/worker.3/``. The environment is built by :mod:`~torchring.launch.spawn.rank_env` from the job's
:class:`~torchring.launch.spawn.rank_env.EnvironmentPlan`, the host's preflight report and the variables of
the job's mode. Ending processes (SIGTERM to the group, then SIGKILL) is
:func:`~torchring.launch.spawn.local.terminate_groups`, whoever decides to.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from ...compat import SHIM_PATH
from ...contract import FLIGHT_RECORD_FILE, JOB_SECRET, STACK_FILE
from ...network import interface_of
from ...store_auth import JobCredentials
from ..hosts import is_local_host
from ..sampling.stack_probe import STACK_HOOK_PATH, Probe, StackProbe, prepare_stack_files
from .containers import ContainerOptions, container_name, docker_run_argv, host_has_nvidia_gpus, stop_argv
from .local import spawn_local
from .output import OutputRelay
from .rank_env import EnvironmentPlan, Placement, rank_environment
from .remote_link import CONTROL_PREFIX, RemoteLink, RemoteLinks, RemoteProbe
from .ssh import HostReport, SshOptions, send_spec, spawn_remote
from .worker import ProcessName, Worker

__all__ = ["ProcessName", "SpawnSettings", "Spawner"]

#: What the docker client itself needs from the environment.
DOCKER_CLIENT_VARIABLES = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "DOCKER_CERT_PATH",
                           "DOCKER_TLS_VERIFY")


@dataclass(frozen=True)
class SpawnSettings:
    """How every process of a job starts, whatever the job's mode."""

    command: Sequence[str]
    environment: EnvironmentPlan
    ssh: SshOptions = field(default_factory=SshOptions)
    horovod_compat: bool = False
    #: ``--image``: every process runs in a container, in ``container_workdir``.
    container: ContainerOptions | None = None
    container_workdir: str = "/workspace"
    #: ``--output-filename``: each process's output also goes to a directory of its own under this one.
    output_dir: str | None = None
    #: ``--verbose``: say where each process starts.
    verbose: bool = False
    #: Where local processes write their stack dumps for the hang detector (None: no stack hook, and
    #: remote processes are not sampled either).
    stack_dir: str | None = None
    #: ``--prefix-output-with-timestamp``: every relayed line starts with the time.
    timestamp_output: bool = False


class Spawner:
    """Starts the job's processes; ``reports`` holds the preflight report of every remote host used."""

    def __init__(self, settings: SpawnSettings, store_port: int, credentials: JobCredentials | None = None,
                 log: Callable[[str], None] | None = None, local_store_address: str = "127.0.0.1") -> None:
        self.settings = settings
        self.store_port = store_port
        #: Where processes on this host find the store (the address it listens on, when not every one).
        self.local_store_address = local_store_address
        #: The job's id and secret, which every process gets (the store's server made them).
        self.credentials = credentials or JobCredentials.new()
        self.job_id = self.credentials.job_id
        self.reports: dict[str, HostReport] = {}
        self._log = log or (lambda message: print(f"torchring run: {message}", file=sys.stderr, flush=True))
        self._local_interface: str | None = None
        #: The links of every process under ``remote_rank``; set ``links.on_lost`` to hear of a lost one.
        self.links = RemoteLinks()

    def close(self) -> None:
        """Stop the links' heartbeat (once every process has ended)."""
        self.links.stop()

    def add_reports(self, reports: Mapping[str, HostReport]) -> None:
        """Remember remote hosts that passed preflight (only those may run processes)."""
        self.reports.update(reports)
        if self._local_interface is None:
            # local processes talk to remote ones over the interface the remote hosts reach this one at
            seen_as = next((r.launcher_address for r in self.reports.values() if r.launcher_address), None)
            self._local_interface = interface_of(seen_as) if seen_as else None

    def placement(self, host: str) -> Placement:
        """Where a process on ``host`` runs."""
        if self.settings.container is not None:
            return Placement.CONTAINER
        return Placement.LOCAL if is_local_host(host) else Placement.SSH

    def start(self, name: ProcessName, host: str, variables: Mapping[str, str], local_size: int,
              show: bool = True, slot: int = 0) -> Worker:
        """Start process ``name`` on ``host`` with the job mode's ``variables`` (``local_size``: how many
        of the job's processes share the host, for ``OMP_NUM_THREADS``); its output relays are running."""
        placement = self.placement(host)
        report = None
        if not is_local_host(host):
            report = self.reports.get(host)
            if report is None or report.launcher_address is None:
                raise RuntimeError(f"host {host} has not passed preflight; no process can start there")
        store_host = report.launcher_address if report is not None else self.local_store_address
        interface = report.interface if report is not None else self._local_interface
        base = self.settings.environment.base(placement, interface)
        env = rank_environment(base, variables, store_host or self.local_store_address, self.store_port, local_size,
                               cpus=report.cpus if report is not None else None, credentials=self.credentials)
        files = self._stack_files(name) if placement is Placement.LOCAL else None
        if files is not None:
            env[STACK_FILE], env[FLIGHT_RECORD_FILE] = str(files[0]), str(files[1])
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(STACK_HOOK_PATH), env.get("PYTHONPATH")) if p)
        process = self._launch(name, None if report is None else host, placement, env)
        link = RemoteLink(host, process) if placement is not Placement.LOCAL else None
        relays = self._relays(name, process, show, link)
        for relay in relays:
            relay.start()
        probe: Probe | None = None
        if files is not None:
            probe = StackProbe(process.pid, *files)
        elif link is not None:
            self.links.add(link)
            probe = RemoteProbe(link) if self._samples_remote(placement) else None
        if self.settings.verbose:
            self._log(f"{name.role} {name.label} started on {host} ({self._how(placement, process)})")
        return Worker(name, host, placement, process, relays, probe, link, slot=slot)

    def _samples_remote(self, placement: Placement) -> bool:
        """Whether ``remote_rank`` samples the process's stack (not yet inside containers)."""
        return placement is Placement.SSH and self.settings.stack_dir is not None

    def _stack_files(self, name: ProcessName) -> tuple[Path, Path] | None:
        if self.settings.stack_dir is None:
            return None
        return prepare_stack_files(Path(self.settings.stack_dir) / f"{name.directory}.{uuid.uuid4().hex[:6]}")

    def _how(self, placement: Placement, process: subprocess.Popen) -> str:
        if placement is Placement.CONTAINER:
            assert self.settings.container is not None
            return f"in a container of {self.settings.container.image}"
        return "over SSH" if placement is Placement.SSH else f"pid {process.pid}"

    def _launch(self, name: ProcessName, remote_host: str | None, placement: Placement,
                env: dict[str, str]) -> subprocess.Popen:
        settings = self.settings
        if placement is Placement.CONTAINER:
            assert settings.container is not None
            container = container_name(self.job_id, name.number, role=name.role)
            report = self.reports.get(remote_host) if remote_host is not None else None
            gpus = report.nvidia_gpus if report is not None else host_has_nvidia_gpus()
            argv = docker_run_argv(settings.container.for_host(gpus), list(settings.command), env,
                                   settings.container_workdir, container, from_client=(JOB_SECRET,))
            client_env = {key: os.environ[key] for key in DOCKER_CLIENT_VARIABLES if key in os.environ}
            client_env[JOB_SECRET] = env[JOB_SECRET]  # docker reads it from its own environment: not in ps
            process = spawn_remote(remote_host, settings.ssh.python, settings.ssh)
            send_spec(process, argv, client_env, os.getcwd(), False, [stop_argv(container)])
            return process
        if placement is Placement.SSH:
            process = spawn_remote(remote_host, settings.ssh.python, settings.ssh)
            send_spec(process, settings.command, env, os.getcwd(), settings.horovod_compat,
                      probe=self._samples_remote(placement))
            return process
        if settings.horovod_compat:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SHIM_PATH), env.get("PYTHONPATH")) if p)
        return spawn_local(settings.command, env)

    def _relays(self, name: ProcessName, process: subprocess.Popen, show: bool,
                link: RemoteLink | None) -> tuple[OutputRelay, OutputRelay]:
        stdout_file, stderr_file = self._output_files(name)
        assert process.stdout is not None and process.stderr is not None
        control = (CONTROL_PREFIX, link.on_control) if link is not None else None
        heard = link.heard if link is not None else None
        stamped = self.settings.timestamp_output
        return (OutputRelay(name.label, "stdout", process.stdout, sys.stdout.buffer, show=show, file=stdout_file,
                            on_line=heard, timestamp=stamped),
                OutputRelay(name.label, "stderr", process.stderr, sys.stderr.buffer, show=show, file=stderr_file,
                            control=control, on_line=heard, timestamp=stamped))

    def _output_files(self, name: ProcessName) -> tuple[BinaryIO | None, BinaryIO | None]:
        if self.settings.output_dir is None:
            return None, None
        directory = Path(self.settings.output_dir) / name.directory
        directory.mkdir(parents=True, exist_ok=True)
        return (directory / "stdout").open("wb"), (directory / "stderr").open("wb")
