"""Elastic ``torchring run`` (``--min-np``/``--max-np``/``--host-discovery-script``): keep a job running
while hosts come and go.

The driver owns the job's membership. It starts workers on free slots of the hosts discovery reports
(a fixed ``-H`` pool or a script polled about every second, minus blacklisted hosts) and publishes
*generations* in the store: for each one, every worker's rank, size and local/cross place
(``environments.elastic`` is the worker's side). When a worker fails (or the hang detector finds it
stuck or frozen, and the driver ends it), ``FailurePolicy`` decides: a new worker takes its slot while
its host still answers, or its host is blacklisted (unreachable, workers failing to start there, repeated
failures; for a cool-down when ``--blacklist-cooldown-range`` is given). The survivors' collectives fail,
they roll back to their last commit and join the next generation with the replacement workers. When
discovery adds hosts, new workers start there, the host-set version is bumped, and the running workers
join them at their next ``commit()``. Below ``--min-np`` the driver waits up to
``--elastic-timeout`` for hosts, then ends every worker with an error. Every membership change is
logged with the time, the old and new size and the reason; ``--reset-limit`` bounds the resets.

Workers start through the job's ``Spawner`` (locally, over SSH or in containers, with output prefixed
``[wN]`` and, with ``--output-filename``, written to ``DIR/worker.N/``); remote hosts pass the same
preflight as in a fixed job the first time they appear. ``--ranks`` shows the output of the workers that
hold those ranks in the latest generation.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..contract import ELASTIC_GENERATION_KEY, HOSTS_VERSION_KEY, elastic_arrived_key, elastic_assignment_key
from ..environments.base import RankInfo
from ..environments.elastic import format_assignment
from .discovery import Blacklist, HostDiscovery
from .failure_policy import FailurePolicy
from .hang_detector import HangDetector
from .hosts import is_local_host
from .local import terminate_groups
from .output import OutputRelay
from .preflight import check_hosts
from .remote_link import RemoteLink
from .rendezvous import RendezvousServer
from .spawner import ProcessName, Spawner
from .ssh import SshOptions
from .supervisor import SSH_CONNECTION_FAILED, describe_returncode
from .worker_env import elastic_variables


@dataclass(frozen=True)
class ElasticSettings:
    """The elastic flags."""

    min_np: int
    max_np: int
    reset_limit: int | None = None
    elastic_timeout_s: float = 600.0
    cooldown_range_s: tuple[float, float] | None = None
    discovery_interval_s: float = 1.0
    #: ``-np``: how many workers the first generation waits for (default: ``min_np``).
    initial_np: int | None = None


@dataclass
class ElasticWorker:
    """One worker process; it keeps its id and host while its rank changes from generation to generation."""

    worker_id: str
    host: str
    slot: int
    process: subprocess.Popen
    relays: tuple[OutputRelay, OutputRelay]
    remote: bool
    returncode: int | None = None
    #: Set when the driver ended it (its host left the pool): not counted as a failure.
    removed: bool = False
    #: Its ``remote_rank`` channel (heartbeat), for a remote or container worker.
    link: RemoteLink | None = None
    #: Set when the driver ended it because the hang detector found it stuck or frozen: a failed worker.
    hang_reason: str | None = None
    #: Its rank in each generation that gave it one (generation -> rank).
    ranks: dict[int, int] = field(default_factory=dict)

    @property
    def number(self) -> int:
        """Its number: 3 for worker ``w3``."""
        return int(self.worker_id.removeprefix("w"))

    def ended_how(self) -> str:
        """How it ended, in words: stuck, cut off, or its exit code."""
        lost = self.link.lost_reason if self.link is not None else None
        assert self.returncode is not None
        return self.hang_reason or lost or describe_returncode(self.returncode, self.remote)

    @property
    def alive(self) -> bool:
        return self.returncode is None

    def unreachable(self) -> str | None:
        """Why its host cannot be reached (its link cut off, its ssh client exited with 255 by itself), else
        None. A worker the driver ended (``hang_reason``) had its ssh client killed, which exits with 255 too."""
        if self.link is not None and self.link.lost_reason:
            return self.link.lost_reason
        if self.remote and self.returncode == SSH_CONNECTION_FAILED and self.hang_reason is None:
            return describe_returncode(self.returncode, self.remote)
        return None


@dataclass
class _Change:
    reasons: list[str] = field(default_factory=list)
    removed_only: bool = True

    def add(self, reason: str, removal: bool) -> None:
        self.reasons.append(reason)
        self.removed_only = self.removed_only and removal


def assign_generation(workers: list[ElasticWorker], host_order: list[str]) -> dict[str, RankInfo]:
    """Ranks host by host (in discovery order), then by slot; local and cross ranks as Horovod defines them."""
    position = {host: index for index, host in enumerate(host_order)}
    ordered = sorted(workers, key=lambda w: (position.get(w.host, len(position)), w.host, w.slot))
    local_index: dict[str, int] = {}
    placed = []
    for worker in ordered:
        local_index[worker.host] = local_index.get(worker.host, -1) + 1
        placed.append((worker, local_index[worker.host]))
    local_sizes = {host: count + 1 for host, count in local_index.items()}
    result = {}
    for rank, (worker, local_rank) in enumerate(placed):
        peers = [w.host for w, lr in placed if lr == local_rank]
        result[worker.worker_id] = RankInfo(rank, len(placed), local_rank, local_sizes[worker.host],
                                            peers.index(worker.host), len(peers), worker.host)
    return result


class ElasticDriver:
    """Runs an elastic job to its end; ``run()`` returns the exit code."""

    def __init__(self, settings: ElasticSettings, discovery: HostDiscovery, spawner: Spawner,
                 server: RendezvousServer, ssh_options: SshOptions, network_interfaces: Sequence[str] = (),
                 ranks_to_show: frozenset[int] | None = None, verbose: bool = False,
                 log: Callable[[str], None] | None = None, detector: HangDetector | None = None) -> None:
        self.settings = settings
        #: Samples the local workers' stacks; a hung job ends (``verdict``), SIGUSR1 prints the report.
        self.detector = detector
        self.discovery = discovery
        self.spawner = spawner
        self.server = server
        self.ssh_options = ssh_options
        self.network_interfaces = tuple(network_interfaces)
        self.ranks_to_show = ranks_to_show
        self.verbose = verbose
        self.log = log or (lambda message: print(f"torchring run: {message}", file=sys.stderr, flush=True))
        self.blacklist = Blacklist(settings.cooldown_range_s)
        self.policy = FailurePolicy(self.blacklist)
        self.workers: list[ElasticWorker] = []
        self.generation = -1
        self.hosts_version = 0
        self.resets = 0
        self._checked_hosts: set[str] = set()
        self._next_worker = 0
        self._stop_signal: int | None = None
        self._host_order: list[str] = []
        self._slots: dict[str, int] = {}
        #: Size of the last generation published, and the rank of each of its workers.
        self._published_size = 0
        self._members: dict[str, int] = {}
        #: The last generation every member of which has arrived (``hvd.init()`` returned there).
        self._arrived_generation = -1

    # ---- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job until training ends, it fails for good or the launcher is stopped; the exit code."""
        if self.verbose:
            self.log(f"elastic job: --min-np {self.settings.min_np}, --max-np {self.settings.max_np}, "
                     f"rendezvous port {self.server.port}")
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        if self.detector is not None:
            detector = self.detector
            previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, lambda _sig, _frame: detector.request_report())
            detector.start()
        try:
            return self._loop()
        finally:
            if self.detector is not None:
                self.detector.stop()
            self._terminate(self.live)
            for worker in self.workers:
                for relay in worker.relays:
                    relay.join(timeout=5)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.spawner.close()
            self.server.close()

    @property
    def live(self) -> list[ElasticWorker]:
        return [w for w in self.workers if w.alive]

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum

    def _loop(self) -> int:
        below_min_since: float | None = None
        next_discovery = 0.0
        available: dict[str, int] = {}
        finished = False
        while True:
            if self._stop_signal is not None:
                self.log(f"received {signal.Signals(self._stop_signal).name}; stopping every worker")
                return 128 + self._stop_signal
            if self.detector is not None and self._generation_forming():
                self.detector.note_progress()  # workers still starting and joining: not a hang
            self._end_stuck_workers()
            change = self._reap()
            if any(w.returncode == 0 for w in self.workers):
                finished = True  # training is over: no more rescaling, let the others end
            if finished:
                self._stop_stranded()
                if not self.live:
                    return self._final_code()
                time.sleep(0.1)
                continue
            now = time.monotonic()
            if now >= next_discovery:
                available = self._available_hosts()
                next_discovery = now + self.settings.discovery_interval_s
            available = {host: slots for host, slots in available.items() if not self.blacklist.blocks(host)}
            for worker in self.live:
                if worker.host not in available:
                    worker.removed = True
                    self._terminate([worker])
                    change.add(f"worker {worker.worker_id} on {worker.host} stopped (host left the pool)", True)
            free = self._free_slots(available)
            target = min(self.settings.max_np, len(self.live) + len(free))
            wants_growth = target > len(self.live)
            if change.reasons or wants_growth or self.generation < 0 or below_min_since is not None or not self.live:
                needed, flag = self._needed()
                if self.detector is not None:
                    self.detector.note_progress()  # a membership change or a wait for hosts is not a hang
                if target < needed:
                    below_min_since = below_min_since or now
                    waited = now - below_min_since
                    if waited > self.settings.elastic_timeout_s:
                        self.log(f"only {target} worker slot(s) available, fewer than {flag} {needed}, for "
                                 f"{waited:.0f} s (--elastic-timeout); ending the job")
                        return 1
                    if change.reasons:
                        self.log(f"{'; '.join(change.reasons)}; waiting up to "
                                 f"{self.settings.elastic_timeout_s:g} s for hosts (need {needed})")
                    time.sleep(0.2)
                    continue
                below_min_since = None
                old_size = self._published_size
                for host, slot in free[:target - len(self.live)]:
                    self._start_worker(host, slot)
                    change.add(f"worker started on {host}", False)
                code = self._publish(old_size, change)
                if code is not None:
                    return code
            time.sleep(0.2)

    def _needed(self) -> tuple[int, str]:
        """How many workers the job cannot run without, and the flag that says so: ``-np`` before the
        first generation when given, ``--min-np`` after."""
        initial = self.settings.initial_np
        if self.generation < 0 and initial is not None and initial > self.settings.min_np:
            return initial, "-np"
        return self.settings.min_np, "--min-np"

    # ---- membership -----------------------------------------------------------------------------

    def _reap(self) -> _Change:
        change = _Change()
        for worker in self.live:
            returncode = worker.process.poll()
            if returncode is None:
                continue
            worker.returncode = returncode
            if returncode == 0 or worker.removed:
                continue
            decision = self.policy.decide(worker.host, worker.unreachable(), self._joined(worker))
            tail = worker.relays[1].tail
            last = f"; last stderr: {tail[-1].strip()}" if tail else ""
            reason = f"worker {worker.worker_id} on {worker.host} {worker.ended_how()}{last}; {decision.text}"
            change.add(reason, True)
        return change

    def _joined(self, worker: ElasticWorker) -> bool:
        """Whether ``worker`` ever arrived in a generation (got through start-up as far as ``hvd.init()``)."""
        store = self.server.auth
        return any(store.get(elastic_arrived_key(generation, rank), max_bytes=16) is not None
                   for generation, rank in worker.ranks.items())

    def _end_stuck_workers(self) -> None:
        """The hang detector's verdict: end the stuck or frozen workers; ``_reap`` then handles them as failed
        workers and the job goes on without them (the others roll back to their last commit)."""
        detector = self.detector
        verdict = detector.verdict if detector is not None else None
        if detector is None or verdict is None or detector.hang_timeout_s <= 0:
            return
        stuck = [w for w in self.live if w.number in verdict.ranks]
        for worker in stuck:
            worker.hang_reason = verdict.reason.split("; blamed:")[0]
            self.log(f"worker {worker.worker_id} on {worker.host} {worker.hang_reason}: ending it as a failed "
                     "worker")
        self._terminate(stuck, grace_s=2.0)
        for number in verdict.ranks:
            detector.forget(number)

    def _available_hosts(self) -> dict[str, int]:
        found = self.discovery.find()
        if self.discovery.last_error:
            self.log(f"warning: {self.discovery.last_error}; using the last hosts found")
        available = {}
        for host, slots in found.items():
            if self.blacklist.blocks(host):
                continue
            if not is_local_host(host) and not self._reachable(host):
                continue
            available[host] = slots
        self._host_order = list(found)
        self._slots = dict(found)
        return available

    def _reachable(self, host: str) -> bool:
        """Preflight a remote host the first time it appears (as a fixed job does); a failing host is
        blacklisted, and checked again when its cool-down ends."""
        if host in self._checked_hosts:
            return True
        reports, problems = check_hosts([host], self.server.port, self.network_interfaces, self.ssh_options,
                                        self.log if self.verbose else None)
        if problems:
            cooldown = self.blacklist.add(host)
            self.log(f"host {host} is unusable: {'; '.join(problems)}; blacklisted "
                     f"{'for good' if cooldown is None else f'for {cooldown:.0f} s'}")
            return False
        self.spawner.add_reports(reports)
        self._checked_hosts.add(host)
        return True

    def _generation_forming(self) -> bool:
        """Whether the current generation is still waiting for some of its workers to arrive (a replacement
        loading torch and rendezvousing takes seconds; the others wait for it meanwhile)."""
        if self.generation < 0 or self._arrived_generation == self.generation:
            return False
        store = self.server.auth
        if all(store.get(elastic_arrived_key(self.generation, rank), max_bytes=16) is not None
               for rank in self._members.values()):
            self._arrived_generation = self.generation
            return False
        return True

    def _stop_stranded(self) -> None:
        """Once training is over, stop the workers waiting in ``hvd.init()`` for a generation that can no
        longer start because one of its workers has already ended (typically workers started on a new
        host just as the others completed their last commit); they would wait for ``--elastic-timeout``."""
        by_id = {worker.worker_id: worker for worker in self.workers}
        members = [(by_id[worker_id], rank) for worker_id, rank in self._members.items()]
        if all(worker.alive for worker, _ in members):
            return
        store = self.server.auth
        arrived = [worker for worker, rank in members
                   if store.get(elastic_arrived_key(self.generation, rank), max_bytes=16) is not None]
        if len(arrived) == len(members):
            return  # it did start: its workers are finishing their training
        stranded = [worker for worker in arrived if worker.alive]
        for worker in stranded:
            worker.removed = True
            self.log(f"worker {worker.worker_id} on {worker.host} stopped: training ended before generation "
                     f"{self.generation} could start")
        self._terminate(stranded)

    def _free_slots(self, available: dict[str, int]) -> list[tuple[str, int]]:
        used = {(w.host, w.slot) for w in self.live}
        return [(host, slot) for host, slots in available.items() for slot in range(slots) if (host, slot) not in used]

    def _publish(self, old_size: int, change: _Change) -> int | None:
        """Write the next generation's assignments, then announce it; None to keep going, else an exit code."""
        live = self.live
        self.generation += 1
        assignments = assign_generation(live, self._host_order)
        store = self.server.auth
        for worker in live:
            info = assignments[worker.worker_id]
            worker.ranks[self.generation] = info.rank
            store.set(elastic_assignment_key(self.generation, worker.worker_id), format_assignment(info))
        if self.ranks_to_show is not None:
            for worker in live:
                for relay in worker.relays:
                    relay.show = assignments[worker.worker_id].rank in self.ranks_to_show
        store.set(ELASTIC_GENERATION_KEY, str(self.generation))
        self._published_size = len(live)
        self._members = {worker_id: info.rank for worker_id, info in assignments.items()}
        stamp = time.strftime("%H:%M:%S")
        if self.generation == 0:
            self.log(f"[{stamp}] elastic job started with {len(live)} workers on "
                     f"{', '.join(dict.fromkeys(w.host for w in live))}")
            return None
        self.hosts_version += 1
        store.set(HOSTS_VERSION_KEY, f"{self.hosts_version} {'removed' if change.removed_only else 'added'}")
        self.resets += 1
        self.log(f"[{stamp}] membership changed: {old_size} -> {len(live)} workers ({'; '.join(change.reasons)}); "
                 f"generation {self.generation}, reset {self.resets}")
        if self.settings.reset_limit is not None and self.resets > self.settings.reset_limit:
            self.log(f"more than --reset-limit {self.settings.reset_limit} resets; ending the job")
            return 1
        return None

    # ---- workers --------------------------------------------------------------------------------

    def _start_worker(self, host: str, slot: int) -> None:
        number = self._next_worker
        self._next_worker += 1
        name = ProcessName("worker", number)
        variables = elastic_variables(name.label, host, self.settings.elastic_timeout_s, self.settings.reset_limit)
        # until the generation is published, a worker has no rank to filter its output by
        spawned = self.spawner.start(name, host, variables, self._slots.get(host, 1),
                                     show=self.ranks_to_show is None)
        self.workers.append(ElasticWorker(name.label, host, slot, spawned.process, spawned.relays, spawned.remote,
                                          link=spawned.link))
        if self.detector is not None:
            self.detector.add(number, spawned.process, spawned.probe)

    def _terminate(self, workers: list[ElasticWorker], grace_s: float = 5.0) -> None:
        terminate_groups([worker.process for worker in workers], grace_s)

    def _final_code(self) -> int:
        succeeded = [w for w in self.workers if w.returncode == 0]
        self.log(f"elastic job finished: {len(succeeded)} worker(s) completed training; "
                 f"{self.resets} reset(s), {len(self.workers)} worker(s) started in all")
        return 0

