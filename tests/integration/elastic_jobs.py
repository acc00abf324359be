"""Real elastic jobs for the tests and for benchmarks/elastic_statistics.py: a launcher whose log is read
as it comes, a worker's pid, and the randomized loss/removal/addition run (real training with
tests/multihost/scripts/elastic_train.py on this machine's loopback addresses as hosts)."""

from __future__ import annotations

import collections
import json
import os
import queue
import random
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from torchring.launch.watch.dump import ask_for_report

from .jobs import MARKER_VARIABLE, ROOT, start_job, wait_until_gone

SCRIPT = ROOT / "tests" / "multihost" / "scripts" / "elastic_train.py"
#: The script's dataset and the epochs these jobs train.
SAMPLES = 240


def processes_with(marker: str, variable: str, value: str) -> list[int]:
    """The pids, lowest first, of the job marked ``marker`` whose environment has ``variable=value``."""
    wanted = {f"{MARKER_VARIABLE}={marker}".encode(), f"{variable}={value}".encode()}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
        except OSError:
            continue
        if wanted <= environ:
            found.append(int(entry.name))
    return sorted(found)


def worker_pid(marker: str, worker_id: str) -> int:
    """The pid of elastic worker ``worker_id`` of the job marked ``marker``."""
    found = processes_with(marker, "TORCHRING_WORKER_ID", worker_id)
    if not found:
        raise AssertionError(f"no process of worker {worker_id}")
    return found[0]


class Launcher:
    """The launcher's stderr, line by line, as it comes (stdout is collected whole)."""

    def __init__(self, *flags: str, epochs: int = 4, log: str = os.devnull, env: dict[str, str] | None = None,
                 step_sleep: float = 0.05) -> None:
        job_env = {**(env or {}), "ELASTIC_LOG": log, "ELASTIC_STEP_SLEEP": str(step_sleep),
                   "ELASTIC_EPOCHS": str(epochs)}
        self.process, self.marker = start_job("run", *flags, sys.executable, str(SCRIPT), env=job_env)
        self.lines: queue.Queue[tuple[float, str]] = queue.Queue()
        self.seen: list[str] = []
        self.stdout: list[str] = []
        #: When each line of ``stdout`` arrived (``time.monotonic()``).
        self.stdout_times: list[float] = []
        self.readers = [threading.Thread(target=self._read, args=(self.process.stderr, self._on_stderr), daemon=True),
                        threading.Thread(target=self._read, args=(self.process.stdout, self._on_stdout),
                                         daemon=True)]
        for reader in self.readers:
            reader.start()

    def _on_stderr(self, line: str) -> None:
        self.lines.put((time.monotonic(), line))

    def _on_stdout(self, line: str) -> None:
        self.stdout_times.append(time.monotonic())
        self.stdout.append(line)

    @staticmethod
    def _read(stream, sink) -> None:
        for line in stream:
            sink(line)

    def wait_for(self, pattern: str, timeout: float = 90.0) -> re.Match[str]:
        """The next launcher line matching ``pattern`` (``self.arrived``: when it came)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.arrived, line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            self.seen.append(line)
            found = re.search(pattern, line)
            if found:
                return found
        raise AssertionError(f"no line matching {pattern!r}:\n" + "".join(self.seen[-30:]))

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        """The exit code and the launcher's whole log once the job ends; past ``timeout`` the launcher is asked
        where every rank is (as ``torchring dump`` does) and stopped, and the test fails with that report."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                report = ask_for_report(self.process.pid)
            except (OSError, TimeoutError) as error:
                report = f"(no stack report: {error})"
            self.process.terminate()
            self.process.wait(timeout=60)
            raise AssertionError(f"the job did not end within {timeout:g} s; its launcher's last lines:\n"
                                 + "".join(self.seen[-30:]) + f"\nwhere every rank was:\n{report[-12000:]}") from None
        for reader in self.readers:
            reader.join(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get()[1])
        return self.process.returncode, "".join(self.seen)

    def checksums(self) -> dict[int, tuple[int, str]]:
        text = "".join(self.stdout)
        return {int(r): (int(n), c) for r, n, c in re.findall(r"final rank (\d+) size (\d+) checksum (\S+)", text)}




def pids_on_host(marker: str, host: str) -> list[int]:
    """The elastic workers of the job marked ``marker`` that run as host ``host``."""
    return processes_with(marker, "TORCHRING_HOSTNAME", host)


def samples_processed_twice(log: Path, epochs: int) -> dict[int, int] | str:
    """Per epoch, how many committed samples were processed more than once; a string when an epoch is
    missing samples (or missing altogether)."""
    batches = {}
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        batches[(entry["epoch"], entry["key"])] = entry["indices"]  # every rank writes each batch
    per_epoch = collections.defaultdict(list)
    for (epoch, _key), indices in batches.items():
        per_epoch[epoch].extend(indices)
    if sorted(per_epoch) != list(range(epochs)):
        return f"epochs logged: {sorted(per_epoch)}"
    repeated = {}
    for epoch, indices in per_epoch.items():
        counts = collections.Counter(indices)
        if set(counts) != set(range(SAMPLES)):
            return f"epoch {epoch} skipped {sorted(set(range(SAMPLES)) - set(counts))[:10]}"
        repeated[epoch] = sum(count - 1 for count in counts.values())
    return repeated


HOSTS = [f"127.0.0.{number}" for number in range(2, 6)]


def random_membership_run(seed: int, tmp: Path) -> tuple[bool, str]:
    """Three loopback hosts, --min-np 2 --max-np 3; once training runs, a worker is killed, a host removed
    and another added, in a random order with random gaps of 0..1.2 s (a discovery interval is about 1 s).
    Right when the job exits 0 with one checksum on every rank, every committed sample of each epoch
    processed once (up to a re-partition's padding) and no process left."""
    rng = random.Random(seed)
    pool, log = tmp / f"pool.{seed}", tmp / f"committed.{seed}.jsonl"
    listed = HOSTS[:3]
    pool.write_text("".join(f"{host}\n" for host in listed))
    epochs = 2
    job = Launcher("--host-discovery-script", f"cat {pool}", "--min-np", "2", "--max-np", "3", epochs=epochs,
                   log=str(log))
    victim, leaving = rng.sample(listed, 2) if rng.random() < 0.5 else [rng.choice(listed)] * 2
    arriving = HOSTS[3]

    def kill() -> None:
        for pid in pids_on_host(job.marker, victim):
            os.kill(pid, signal.SIGKILL)

    def remove() -> None:
        listed.remove(leaving)
        pool.write_text("".join(f"{host}\n" for host in listed))

    def add() -> None:
        listed.append(arriving)
        pool.write_text("".join(f"{host}\n" for host in listed))

    events = [("kill " + victim, kill), ("remove " + leaving, remove), ("add " + arriving, add)]
    rng.shuffle(events)
    story = []
    try:
        deadline = time.monotonic() + 90
        while not any("progress epoch 0 batch 5" in line for line in job.stdout):
            if time.monotonic() > deadline or job.process.poll() is not None:
                return False, "training never started:\n" + "".join(job.stdout[-5:])
            time.sleep(0.05)
        for name, event in events:
            event()
            story.append(name)
            time.sleep(rng.uniform(0.0, 1.2))
        code, text = job.finish(timeout=180)
    finally:
        if job.process.poll() is None:
            job.process.kill()
            job.process.wait()
    summary = f"seed {seed} ({', '.join(story)})"
    checksums = job.checksums()
    twice = samples_processed_twice(log, epochs)
    left = wait_until_gone(job.marker)
    launcher_lines = "".join(line for line in text.splitlines(keepends=True) if line.startswith("torchring run"))
    if code != 0 or not checksums or len({c for _, c in checksums.values()}) != 1:
        return False, f"{summary}: exit {code}, checksums {checksums}\n{launcher_lines[-3000:]}"
    if isinstance(twice, str) or max(twice.values()) > 3 * 2:
        return False, f"{summary}: samples {twice}\n{launcher_lines[-3000:]}"
    if left:
        return False, f"{summary}: processes left {left}"
    sizes = sorted({size for size, _ in checksums.values()})
    return True, f"{summary}: exit 0 on {len(checksums)} ranks (size {sizes}), samples twice per epoch {twice}"
