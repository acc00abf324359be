"""Elastic jobs on the namespace cluster: a frozen worker ended by the hang detector, a host added, too
few hosts left, a worker that fails at start-up. A discovery script reads a file the tests edit."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchring.launch.watch.dump import ask_for_report

from ..integration.elastic_jobs import samples_processed_twice

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "scripts" / "elastic_train.py"
SAMPLES = 240
EPOCHS = 2


def start(cluster, tmp_path, hosts, *flags, env=None):
    pool = tmp_path / "hosts.txt"
    pool.write_text("".join(f"{host}\n" for host in hosts))
    log = tmp_path / "committed.jsonl"
    command = [sys.executable, "-m", "torchring.cli", "run", "--host-discovery-script", f"cat {pool}",
               "--slots-per-host", "1", *flags, "-x", "ELASTIC_LOG", "-x", "ELASTIC_STEP_SLEEP", "-x",
               "ELASTIC_EPOCHS", "-x", "FAIL_ON_HOST", "-x", "ELASTIC_GROW_TO",
               sys.executable, str(SCRIPT)]
    job_env = cluster.env({**os.environ, "ELASTIC_LOG": str(log), "ELASTIC_STEP_SLEEP": "0.06",
                           "ELASTIC_EPOCHS": str(EPOCHS), **(env or {})})
    process = subprocess.Popen(command, cwd=ROOT, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    return process, pool, log


def wait_for_progress(process, count, lines):
    """Read rank 0's output until ``count`` progress lines went by."""
    seen = 0
    deadline = time.monotonic() + 120
    while seen < count and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        seen += "progress epoch" in line
    assert seen >= count, "".join(lines[-20:])


def wait_for_launcher(process, text, lines, timeout=60):
    """Read the launcher's log until a line holds ``text``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        assert line, "the launcher ended first:\n" + "".join(lines[-20:])
        lines.append(line)
        if text in line:
            return
    raise AssertionError(f"no {text!r} within {timeout} s:\n" + "".join(lines[-20:]))


def finish(process, lines, timeout=240):
    """The job's whole output once it ends; past ``timeout`` the launcher is asked where every rank is (as
    ``torchring dump`` does) and stopped (SIGTERM ends its ranks on every host) before the test fails, so that
    the failure shows where the job hung and no later test finds its processes on the hosts."""
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            report = ask_for_report(process.pid)
        except (OSError, TimeoutError) as error:
            report = f"(no stack report: {error})"
        process.terminate()
        out, err = process.communicate(timeout=60)
        raise AssertionError(f"the job did not end within {timeout} s; its launcher's log:\n{err[-4000:]}\n"
                             f"where every rank was:\n{report[-12000:]}") from None
    return "".join(lines) + out, err


def final_checksums(stdout):
    return {int(rank): (int(size), checksum)
            for rank, size, checksum in re.findall(r"final rank (\d+) size (\d+) checksum (\S+)", stdout)}


def assert_every_sample_once_per_epoch(log, max_size):
    repeated = samples_processed_twice(log, EPOCHS)
    assert not isinstance(repeated, str), repeated
    for epoch, count in repeated.items():
        # only the padding a re-partition adds at the end of an epoch (at most size - 1 per partition)
        assert count <= 3 * (max_size - 1), f"epoch {epoch}: {count} samples processed twice"


def assert_hosts_empty(cluster):
    for host in cluster.hosts:
        left = cluster.wait_until_empty(host, timeout=15)
        assert left == [], f"processes left on {host.name}: {_command_lines(left)}"


def _command_lines(pids):
    """``pid: command line`` of each of ``pids`` still running, for a failure's message."""
    lines = []
    for pid in pids:
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            command = "(gone)"
        lines.append(f"{pid}: {command.strip()}")
    return "; ".join(lines)


def _worker_pids(cluster, host):
    """The elastic workers' Python processes on ``host`` (not their supervisor or sshd)."""
    pids = []
    for pid in cluster.pids_in(host):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(part.endswith(b"elastic_train.py") for part in command):
            pids.append(pid)
    return pids


def test_a_frozen_worker_is_ended_as_a_failed_worker_and_replaced_on_its_host(cluster, tmp_path):
    process, _, log = start(cluster, tmp_path, ["h1", "h2", "h3"], "--min-np", "2", "--max-np", "3",
                            "--hang-timeout", "4")
    lines = []
    wait_for_progress(process, 8, lines)
    frozen = _worker_pids(cluster, "h3")
    assert frozen
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)  # the hosts share this machine's pid namespace
    stdout, stderr = finish(process, lines)
    assert process.returncode == 0, stderr[-3000:]
    assert re.search(r"worker w2 on h3 froze \(process state T, stopped\).*: ending it as a failed worker", stderr), \
        stderr[-3000:]
    # h3 still answers (its supervisor and sshd run): the frozen worker is replaced there, not blacklisted
    assert re.search(r"membership changed: 3 -> 3 workers \(worker w2 on h3 froze .*; replacing it on h3 \(h3 still "
                     r"answers.*worker started on h3\)", stderr), stderr[-3000:]
    assert "h3 blacklisted" not in stderr
    # one reset only, and every worker ends on its own (a shutdown stuck in the waker was ended as a hang)
    assert "elastic job finished: 3 worker(s) completed training; 1 reset(s)" in stderr, stderr[-3000:]
    checksums = final_checksums(stdout)
    assert sorted(checksums) == [0, 1, 2] and len({c for _, c in checksums.values()}) == 1
    assert all(size == 3 for size, _ in checksums.values())
    assert_every_sample_once_per_epoch(log, 3)
    assert_hosts_empty(cluster)


def test_an_added_host_grows_the_job(cluster, tmp_path):
    out = tmp_path / "out"
    process, pool, log = start(cluster, tmp_path, ["h1", "h2"], "--min-np", "2", "--max-np", "3",
                               "--output-filename", str(out), "--verbose", env={"ELASTIC_GROW_TO": "3"})
    lines = []
    wait_for_progress(process, 5, lines)
    pool.write_text("h1\nh2\nh3\n")
    stdout, stderr = finish(process, lines)
    assert process.returncode == 0, stderr[-3000:]
    assert re.search(r"membership changed: 2 -> 3 workers \(worker started on h3\)", stderr), stderr
    assert "preflight on h3" in stderr and "worker w2 started on h3 (over SSH)" in stderr
    checksums = final_checksums(stdout)
    assert sorted(checksums) == [0, 1, 2] and len({c for _, c in checksums.values()}) == 1
    assert f"final rank 2 size 3 checksum {checksums[2][1]}" in (out / "worker.2" / "stdout").read_text()
    assert_every_sample_once_per_epoch(log, 3)
    assert_hosts_empty(cluster)


@pytest.mark.parametrize("kill_first", [True, False], ids=["kill-then-remove", "remove-then-kill"])
def test_a_host_lost_with_its_workers_and_removed_from_the_pool_at_once_finishes_on_the_survivors(
        cluster, tmp_path, kill_first):
    """Every job process on h3 SIGKILLed and h3 removed from the discovery file at the same moment, in
    both orders: the driver may start a replacement on h3 before it sees h3 leave; the generation it
    then publishes holds only workers that really run, so the two survivors finish."""
    process, pool, log = start(cluster, tmp_path, ["h1", "h2", "h3"], "--min-np", "2", "--max-np", "3")
    lines = []
    wait_for_progress(process, 8, lines)
    events = [lambda: [os.kill(pid, signal.SIGKILL) for pid in _worker_pids(cluster, "h3")],
              lambda: pool.write_text("h1\nh2\n")]
    for event in events if kill_first else reversed(events):
        event()
    stdout, stderr = finish(process, lines, timeout=120)
    assert process.returncode == 0, stderr[-3000:]
    checksums = final_checksums(stdout)
    assert sorted(checksums) == [0, 1] and len({c for _, c in checksums.values()}) == 1, stdout[-2000:]
    assert all(size == 2 for size, _ in checksums.values())
    assert re.search(r"generation \d+ trained its first step [\d.]+ s after the (host|worker) lost was seen", stderr)
    assert_every_sample_once_per_epoch(log, 3)
    assert_hosts_empty(cluster)


def test_below_min_np_the_job_waits_and_continues_when_a_host_returns(cluster, tmp_path):
    """Horovod's long-open elastic deadlock: the survivors fall below --min-np, then a host returns. h2 and
    h3 lose every process (so both are blacklisted as unreachable) and leave the pool; the survivor waits in
    hvd.init(); h3 is listed again (off the blacklist, preflighted afresh) and the job finishes on 2."""
    process, pool, log = start(cluster, tmp_path, ["h1", "h2", "h3"], "--min-np", "2", "--max-np", "3",
                               "--elastic-timeout", "60")
    lines = []
    wait_for_progress(process, 6, lines)
    cluster.kill_all_in("h2")
    cluster.kill_all_in("h3")
    wait_for_launcher(process, "waiting up to 60 s for hosts (need 2)", lines)
    pool.write_text("h1\n")
    wait_for_launcher(process, "host h3 left the pool", lines)
    pool.write_text("h1\nh3\n")
    stdout, stderr = finish(process, [], timeout=180)
    stderr = "".join(line for line in lines if line.startswith("torchring run")) + stderr
    assert process.returncode == 0, stderr[-3000:]
    assert "host h3 is listed again after discovery dropped it: off the blacklist" in stderr, stderr[-3000:]
    assert re.search(r"enough hosts again after \d+ s below --min-np 2", stderr), stderr[-3000:]
    checksums = final_checksums(stdout)
    assert len(checksums) == 2 and len({c for _, c in checksums.values()}) == 1, stdout[-2000:]
    assert_every_sample_once_per_epoch(log, 3)
    assert_hosts_empty(cluster)


def test_too_few_hosts_left_ends_the_job_after_the_elastic_timeout(cluster, tmp_path):
    process, _, _ = start(cluster, tmp_path, ["h1", "h2", "h3"], "--min-np", "2", "--max-np", "3",
                          "--elastic-timeout", "5")
    lines = []
    wait_for_progress(process, 4, lines)
    cluster.kill_all_in("h2")
    cluster.kill_all_in("h3")
    start_wait = time.monotonic()
    _, stderr = finish(process, lines, timeout=120)
    assert process.returncode != 0
    assert time.monotonic() - start_wait < 60
    assert "fewer than --min-np 2" in stderr and "(--elastic-timeout); ending the job" in stderr, stderr[-3000:]
    assert_hosts_empty(cluster)


def test_a_worker_failing_at_start_up_is_blacklisted(cluster, tmp_path):
    process, _, log = start(cluster, tmp_path, ["h1", "h2", "h3"], "--min-np", "2", "--max-np", "3",
                            env={"FAIL_ON_HOST": "h2", "ELASTIC_STEP_SLEEP": "0.02"})
    stdout, stderr = finish(process, [])
    assert process.returncode == 0, stderr[-3000:]
    assert re.search(r"worker w1 on h2 exited with code 3; last stderr: failing on purpose on h2; h2 blacklisted "
                     r"for good \(its worker never joined a generation", stderr), stderr[-3000:]
    checksums = final_checksums(stdout)
    assert sorted(checksums) == [0, 1] and len({c for _, c in checksums.values()}) == 1
    assert_every_sample_once_per_epoch(log, 3)
    assert_hosts_empty(cluster)


def test_reset_limit_ends_the_job(cluster, tmp_path):
    process, _, _ = start(cluster, tmp_path, ["h1", "h2", "h3"], "--min-np", "2", "--max-np", "3",
                          "--reset-limit", "0")
    lines = []
    wait_for_progress(process, 4, lines)
    cluster.kill_all_in("h3")
    _, stderr = finish(process, lines, timeout=120)
    assert process.returncode == 1
    assert "more than --reset-limit 0 resets; ending the job" in stderr, stderr[-3000:]
    assert_hosts_empty(cluster)


EXAMPLE = ROOT / "examples" / "elastic_mnist.py"


def run_example(cluster, tmp_path, hosts, *args, env=None, kill_host_after=None, stop_after=None):
    """Run examples/elastic_mnist.py elastically on ``hosts``; optionally SIGKILL everything on a host,
    or SIGTERM the launcher, once rank 0 has printed that many progress lines."""
    pool = tmp_path / "pool.txt"
    pool.write_text("".join(f"{host}\n" for host in hosts))
    command = [sys.executable, "-m", "torchring.cli", "run", "--min-np", "2", "--max-np", str(len(hosts)),
               "--host-discovery-script", f"cat {pool}", "-x", "TORCHRING_CHECKPOINT_DIR", sys.executable,
               str(EXAMPLE), *args]
    process = subprocess.Popen(command, cwd=ROOT, env=cluster.env({**os.environ, **(env or {})}),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    if kill_host_after or stop_after:
        count = kill_host_after[1] if kill_host_after else stop_after
        seen = 0
        while seen < count:
            line = process.stdout.readline()
            assert line, "".join(lines[-10:]) + process.stderr.read()[-3000:]
            lines.append(line)
            seen += "Train Epoch" in line
        if kill_host_after:
            cluster.kill_all_in(kill_host_after[0])
        else:
            process.send_signal(signal.SIGTERM)
    out, err = finish(process, lines)
    return process.returncode, out, err


def example_accuracy(stdout):
    found = re.findall(r"Test set: Accuracy: ([\d.]+) \((\d+) ranks at the end\)", stdout)
    assert found, stdout[-2000:]
    return float(found[-1][0]), int(found[-1][1])


def test_elastic_mnist_survives_a_lost_host_with_the_accuracy_of_an_undisturbed_run(cluster, tmp_path):
    code, out, err = run_example(cluster, tmp_path, ["h1", "h2", "h3"], "--epochs", "5")
    assert code == 0, err[-3000:]
    undisturbed, size = example_accuracy(out)
    assert size == 3
    code, out, err = run_example(cluster, tmp_path, ["h1", "h2", "h3"], "--epochs", "5",
                                 kill_host_after=("h3", 6))
    assert code == 0, err[-3000:]
    disturbed, size = example_accuracy(out)
    assert size == 2 and "membership changed: 3 -> 2 workers" in err
    # not worse than undisturbed: the last three epochs ran on 2 ranks, 23 smaller steps each instead of 15,
    # and the rollback point (with the dropout draws since) varies with the kill: 10 runs under load ended
    # 0.011 below to 0.025 above the undisturbed 0.914 (a state lost or corrupted in the reset ends lower)
    assert disturbed >= undisturbed - 0.02, (disturbed, undisturbed)
    assert_hosts_empty(cluster)


def test_elastic_mnist_resumes_from_its_last_commit_after_the_whole_job_was_killed(cluster, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    env = {"TORCHRING_CHECKPOINT_DIR": str(checkpoints)}
    code, out, _ = run_example(cluster, tmp_path, ["h1", "h2"], "--epochs", "2", env=env, stop_after=5)
    assert code != 0 and (checkpoints / "torchring-elastic-state.pt").exists()
    assert "Test set" not in out
    assert_hosts_empty(cluster)
    code, out, err = run_example(cluster, tmp_path, ["h1", "h2"], "--epochs", "2", env=env)
    assert code == 0, err[-3000:]
    assert "resuming from the checkpoint" in err
    first_batch = re.search(r"Train Epoch: (\d+) batch (\d+)", out)
    assert first_batch and (int(first_batch.group(1)), int(first_batch.group(2))) != (1, 5), out[:500]
    example_accuracy(out)
    assert_hosts_empty(cluster)
