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

What to do on each pass is decided by ``elastic_plan`` (a generation's members are the workers really
running; a generation holding one that is not is replaced), whatever happened in the same pass. With
``--spares K`` the driver keeps K hot spares started on slots beyond ``--max-np``: workers waiting in
their first ``hvd.init()`` that take a lost worker's place without a cold start; a lost spare is
replaced in the background. ``elastic_recovery`` times each recovery, from the change seen to the
first step of the new generation.

Workers start through the job's ``Spawner`` (locally, over SSH or in containers, with output prefixed
``[wN]`` and, with ``--output-filename``, written to ``DIR/worker.N/``); remote hosts pass the same
preflight as in a fixed job the first time they appear. ``--ranks`` shows the output of the workers that
hold those ranks in the latest generation.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence

from ...contract import (
    ELASTIC_GENERATION_KEY,
    ELASTIC_SPARE,
    HOSTS_VERSION_KEY,
    elastic_arrived_key,
    elastic_assignment_key,
    elastic_standby_key,
)
from ...environments.elastic import format_assignment
from ..rendezvous import RendezvousServer
from ..spawn.local import terminate_groups
from ..spawn.preflight import check_hosts
from ..spawn.rank_env import elastic_variables
from ..spawn.ssh import SshOptions
from ..spawn.worker import ProcessName, Worker, WorkerStarter, reap
from ..watch.hang_detector import HangDetector
from .discovery import Blacklist, Discovery
from .failure_policy import FailurePolicy
from .host_pool import HostPool
from .plan import WorkerView, assign_generation, plan_membership
from .records import ElasticSettings, MembershipChange
from .recovery import RecoveryClock

#: Seconds between two passes of the driver's loop.
POLL_S = 0.1


class ElasticDriver:
    """Runs an elastic job to its end; ``run()`` returns the exit code."""

    def __init__(self, settings: ElasticSettings, discovery: Discovery, spawner: WorkerStarter,
                 server: RendezvousServer, ssh_options: SshOptions, network_interfaces: Sequence[str] = (),
                 ranks_to_show: frozenset[int] | None = None, verbose: bool = False,
                 log: Callable[[str], None] | None = None, detector: HangDetector | None = None,
                 recovery: RecoveryClock | None = None,
                 preflight: Callable[[str], list[str]] | None = None) -> None:
        """``preflight(host)``: the problems that keep a remote host out of the pool (default: the SSH
        preflight of a fixed job); a starter whose workers need no SSH (Ray actors) passes its own."""
        self.settings = settings
        #: Times each recovery; its figures are on the ``--metrics-port`` page.
        self.recovery = recovery or RecoveryClock()
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
        self.hosts = HostPool(discovery, self.blacklist, preflight or self._preflight, self.log)
        self.workers: list[Worker] = []
        self.generation = -1
        self.hosts_version = 0
        self.resets = 0
        self._next_worker = 0
        self._stop_signal: int | None = None
        #: Size of the last generation published, and the rank of each of its workers.
        self._published_size = 0
        self._members: dict[str, int] = {}
        #: The last generation every member of which has arrived (``hvd.init()`` returned there).
        self._arrived_generation = -1
        self._said_no_spare_slot = False
        #: Loop state: when the job fell below the minimum, when discovery runs next, whether training ended.
        self._below_min_since: float | None = None
        self._next_discovery = 0.0
        self._finished = False

    # ---- the loop -------------------------------------------------------------------------------

    def run(self) -> int:
        """Run the job until training ends, it fails for good or the launcher is stopped; the exit code."""
        if self.verbose:
            self.log(f"elastic job: --min-np {self.settings.min_np}, --max-np {self.settings.max_np}, "
                     f"rendezvous port {self.server.port}")
        in_main_thread = threading.current_thread() is threading.main_thread()  # only there can it set handlers
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)} if in_main_thread else {}
        if self.detector is not None:
            detector = self.detector
            if in_main_thread:
                previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1,
                                                         lambda _sig, _frame: detector.request_report())
            detector.start()
        try:
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.close()

    def close(self) -> None:
        """Stop the detector and every worker still running (the job's scaffold then closes the spawner and
        the store)."""
        if self.detector is not None:
            self.detector.stop()
        self._terminate(self.live)
        for worker in self.workers:
            worker.join_relays()

    @property
    def live(self) -> list[Worker]:
        return [w for w in self.workers if w.alive]

    @property
    def spares(self) -> list[Worker]:
        """The hot spares running (not given a place, not being stopped)."""
        return [w for w in self.live if w.spare and w.running]

    @property
    def members(self) -> dict[str, int]:
        """The published generation's members: worker id -> rank."""
        return dict(self._members)

    @property
    def waiting_for_hosts(self) -> bool:
        """Below the minimum, waiting for hosts (``--elastic-timeout``)."""
        return self._below_min_since is not None

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum

    def _loop(self) -> int:
        while True:
            code = self.step()
            if code is not None:
                return code
            time.sleep(POLL_S)

    def step(self) -> int | None:
        """One pass: reap ended workers, refresh the pool, then start, promote, stop and publish as
        ``plan_membership`` says. None to go on, else the job's exit code."""
        if self._stop_signal is not None:
            self.log(f"received {signal.Signals(self._stop_signal).name}; stopping every worker")
            return 128 + self._stop_signal
        if self.detector is not None and self._generation_forming():
            self.detector.note_progress()  # workers still starting and joining: not a hang
        self._end_stuck_workers()
        change = self._reap()
        if any(w.returncode == 0 for w in self.workers):
            self._finished = True  # training is over: no more rescaling, let the others end
        if self._finished:
            self._stop_spares()
            self._stop_stranded()
            return None if self.live else self._final_code()
        now = time.monotonic()
        if now >= self._next_discovery:
            self.hosts.refresh()
            self._next_discovery = now + self.settings.discovery_interval_s
        available = self.hosts.usable()
        self._stop_workers_off_the_pool(available, change)
        self._note_recovery()
        plan = plan_membership(self._views(), self.generation >= 0, self._free_slots(available),
                               self.settings.max_np, self._needed()[0], self.settings.spares)
        if plan.waiting_for is not None:
            return self._wait_for_hosts(plan.waiting_for, change, available, now)
        if self._below_min_since is not None:
            self.log(f"enough hosts again after {now - self._below_min_since:.0f} s below {self._needed()[1]} "
                     f"{self._needed()[0]}")
            self._below_min_since = None
        if plan.publish:
            if self.detector is not None:
                self.detector.note_progress()  # a membership change is not a hang
            by_id = {worker.worker_id: worker for worker in self.workers}
            members = [by_id[worker_id] for worker_id in plan.members]
            for worker_id in plan.promoted:
                self._promote(by_id[worker_id])
                change.add(f"spare {worker_id} on {by_id[worker_id].host} took a place", False)
            for host, slot in plan.start_members:
                members.append(self._start_worker(host, slot))
                change.add(f"worker started on {host}", False)
            if self.generation >= 0 and not plan.broken:
                self.recovery.seen("host_added")
            code = self._publish(members, change)
            if code is not None:
                return code
        if self.generation == 0 or self.recovery.quiet():  # a recovery under way has the CPU first
            for host, slot in plan.start_spares:
                self._start_worker(host, slot, spare=True)
        self._say_if_no_spare_fits(plan.publish, len(plan.start_spares))
        return None

    def _wait_for_hosts(self, needed: int, change: MembershipChange, available: dict[str, int],
                        now: float) -> int | None:
        """Below the minimum: wait up to ``--elastic-timeout`` for hosts (the workers wait in ``hvd.init()``),
        then end the job; None while waiting."""
        if self.detector is not None:
            self.detector.note_progress()  # a wait for hosts is not a hang
        self._below_min_since = self._below_min_since or now
        waited = now - self._below_min_since
        if waited > self.settings.elastic_timeout_s:
            slots = len([w for w in self.live if w.running]) + len(self._free_slots(available))
            self.log(f"only {slots} worker slot(s) available, fewer than {self._needed()[1]} {needed}, for "
                     f"{waited:.0f} s (--elastic-timeout); ending the job")
            return 1
        if change.reasons:
            self.log(f"{'; '.join(change.reasons)}; waiting up to {self.settings.elastic_timeout_s:g} s for hosts "
                     f"(need {needed})")
        return None

    def _needed(self) -> tuple[int, str]:
        """How many workers the job cannot run without, and the flag that says so: ``-np`` before the
        first generation when given, ``--min-np`` after."""
        initial = self.settings.initial_np
        if self.generation < 0 and initial is not None and initial > self.settings.min_np:
            return initial, "-np"
        return self.settings.min_np, "--min-np"

    # ---- membership -----------------------------------------------------------------------------

    def _reap(self) -> MembershipChange:
        """Collect the workers that ended: a member's failure is a membership change (and starts the
        recovery clock), a spare's is replaced in the background."""
        change = MembershipChange()
        for worker in reap(self.workers):
            if worker.returncode == 0 or worker.stopping:
                continue
            decision = self.policy.decide(worker.host, worker.unreachable(), self._joined(worker))
            tail = worker.relays[1].tail
            last = f"; last stderr: {tail[-1].strip()}" if tail else ""
            reason = f"worker {worker.worker_id} on {worker.host} {worker.ended_how()}{last}; {decision.text}"
            if worker.spare:
                self.log(f"hot spare {reason.removeprefix('worker ')}; starting another spare where a slot is free")
                continue
            self.recovery.seen("host_lost" if decision.blacklisted else "worker_lost")
            change.add(reason, True)
        return change

    def _stop_workers_off_the_pool(self, available: dict[str, int], change: MembershipChange) -> None:
        """Stop the workers on hosts (or slots) discovery no longer lists, or blacklisted ones."""
        gone = [w for w in self.live if w.running and not (w.host in available and w.slot < available[w.host])]
        for worker in gone:
            worker.stop()
        self._terminate(gone)
        for worker in gone:
            what = "host" if worker.host not in available else f"slot {worker.slot} of the host"
            if worker.spare:
                self.log(f"hot spare {worker.worker_id} on {worker.host} stopped ({what} left the pool)")
                continue
            if worker.worker_id in self._members:
                self.recovery.seen("host_lost")
            change.add(f"worker {worker.worker_id} on {worker.host} stopped ({what} left the pool)", True)

    def _views(self) -> list[WorkerView]:
        """Every running worker and every member of the published generation, for ``plan_membership``."""
        views = []
        for worker in self.workers:
            member = worker.worker_id in self._members
            if not (worker.running or member):
                continue
            if worker.spare and not worker.standing_by and worker.running:
                worker.standing_by = self.server.auth.get(elastic_standby_key(worker.worker_id),
                                                          max_bytes=16) is not None
                if worker.standing_by:
                    self.log(f"hot spare {worker.worker_id} on {worker.host} standing by (waiting in hvd.init())")
            views.append(WorkerView(worker.worker_id, worker.host, worker.slot, worker.running, member,
                                    worker.standing_by))
        return views

    def _note_recovery(self) -> None:
        """Log a recovery once the generation it waited for completed its first step."""
        self.recovery.spares = len(self.spares)
        line = self.recovery.poll(self.server.auth)
        if line is not None:
            self.log(f"[{time.strftime('%H:%M:%S')}] {line}")

    def _say_if_no_spare_fits(self, published: bool, started: int) -> None:
        """Once: ``--spares`` asked for spares that no free slot can hold."""
        spares = self.settings.spares
        standing = len(self.spares)
        if not published or not spares or self._said_no_spare_slot or standing + started >= spares:
            return
        self._said_no_spare_slot = True
        self.log(f"--spares {spares}: only {standing + started} spare(s) fit, every other slot holds a training "
                 f"worker (spares stand by on slots beyond --max-np {self.settings.max_np})")

    def _joined(self, worker: Worker) -> bool:
        """Whether ``worker`` got through start-up as far as ``hvd.init()``: it arrived in a generation, or
        stood by there as a hot spare."""
        store = self.server.auth
        if worker.standing_by or store.get(elastic_standby_key(worker.worker_id), max_bytes=16) is not None:
            return True
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
            worker.hung(verdict.reason.split("; blamed:")[0])
            self.log(f"worker {worker.worker_id} on {worker.host} {worker.stop_reason}: ending it as a failed "
                     "worker")
        self._terminate(stuck, grace_s=2.0)
        for number in verdict.ranks:
            detector.forget(number)

    def _preflight(self, host: str) -> list[str]:
        """Check a remote host as a fixed job does (SSH, versions, the store reachable); its problems."""
        reports, problems = check_hosts([host], self.server.port, self.network_interfaces, self.ssh_options,
                                        self.log if self.verbose else None)
        if not problems:
            self.spawner.add_reports(reports)
        return problems

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
            worker.stop()
            self.log(f"worker {worker.worker_id} on {worker.host} stopped: training ended before generation "
                     f"{self.generation} could start")
        self._terminate(stranded)

    def _free_slots(self, available: dict[str, int]) -> list[tuple[str, int]]:
        """Usable slots no live worker holds (a worker being stopped still holds its slot until it ended)."""
        used = {(w.host, w.slot) for w in self.live}
        return [(host, slot) for host, slots in available.items() for slot in range(slots) if (host, slot) not in used]

    def _stop_spares(self) -> None:
        """Training is over: the spares have nothing left to replace."""
        spares = self.spares
        for worker in spares:
            worker.stop()
        self._terminate(spares)

    def _publish(self, members: list[Worker], change: MembershipChange) -> int | None:
        """Write the next generation's assignments for ``members``, then announce it; None to keep going,
        else an exit code."""
        old_size = self._published_size
        self.generation += 1
        assignments = assign_generation([(w.worker_id, w.host, w.slot) for w in members], self.hosts.order,
                                        self._members)
        store = self.server.auth
        for worker in members:
            info = assignments[worker.worker_id]
            worker.ranks[self.generation] = info.rank
            store.set(elastic_assignment_key(self.generation, worker.worker_id), format_assignment(info))
        if self.ranks_to_show is not None:
            for worker in members:
                for relay in worker.relays:
                    relay.show = assignments[worker.worker_id].rank in self.ranks_to_show
        store.set(ELASTIC_GENERATION_KEY, str(self.generation))
        self._published_size = len(members)
        self._members = {worker_id: info.rank for worker_id, info in assignments.items()}
        self.recovery.published(self.generation, len(members))
        stamp = time.strftime("%H:%M:%S")
        if self.generation == 0:
            self.log(f"[{stamp}] elastic job started with {len(members)} workers on "
                     f"{', '.join(dict.fromkeys(w.host for w in members))}")
            return None
        self.hosts_version += 1
        store.set(HOSTS_VERSION_KEY, f"{self.hosts_version} {'removed' if change.removed_only else 'added'}")
        self.resets += 1
        self.recovery.resets = self.resets
        self.log(f"[{stamp}] membership changed: {old_size} -> {len(members)} workers ({'; '.join(change.reasons)}); "
                 f"generation {self.generation}, reset {self.resets}")
        if self.settings.reset_limit is not None and self.resets > self.settings.reset_limit:
            self.log(f"more than --reset-limit {self.settings.reset_limit} resets; ending the job")
            return 1
        return None

    # ---- workers --------------------------------------------------------------------------------

    def _start_worker(self, host: str, slot: int, spare: bool = False) -> Worker:
        number = self._next_worker
        self._next_worker += 1
        name = ProcessName("worker", number)
        variables = elastic_variables(name.label, host, self.settings.elastic_timeout_s, self.settings.reset_limit)
        if spare:
            variables[ELASTIC_SPARE] = "1"
        # until the generation is published, a worker has no rank to filter its output by
        worker = self.spawner.start(name, host, variables, self.hosts.slots.get(host, 1),
                                    show=self.ranks_to_show is None, slot=slot)
        worker.spare = spare
        self.workers.append(worker)
        if spare:
            self.log(f"hot spare {worker.worker_id} starting on {host}")
        elif self.detector is not None:
            self.detector.add(number, worker.process, worker.probe)
        return worker

    def _promote(self, worker: Worker) -> None:
        """A spare takes a place: from now on it is a worker like the others (and watched for hangs)."""
        worker.spare = False
        if self.detector is not None:
            self.detector.add(worker.number, worker.process, worker.probe)

    def _terminate(self, workers: list[Worker], grace_s: float = 5.0) -> None:
        terminate_groups([worker.process for worker in workers], grace_s)

    def _final_code(self) -> int:
        succeeded = [w for w in self.workers if w.returncode == 0]
        spares = sum(1 for w in self.workers if w.spare)
        unused = f" ({spares} of them hot spares never needed)" if spares else ""
        self.log(f"elastic job finished: {len(succeeded)} worker(s) completed training; "
                 f"{self.resets} reset(s), {len(self.workers)} worker(s) started in all{unused}")
        return 0

