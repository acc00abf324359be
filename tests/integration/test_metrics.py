"""Prometheus metrics of a running job, scraped over HTTP and parsed by prometheus_client."""

import os
import socket
import subprocess
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from ..ports import free_port
from .jobs import ROOT, SCRIPTS


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def value(values, name, **labels):
    return values[(name, tuple(sorted(labels.items())))]


def wait_for_ready(process, count):
    ready = 0
    deadline = time.monotonic() + 90
    while ready < count and time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        ready += line.strip().endswith("ready")
    assert ready == count


def steps_of_every_rank(values) -> list[float]:
    return [values.get(("torchring_steps_total", (("host", socket.gethostname()), ("rank", rank))), 0.0)
            for rank in ("0", "1")]


def scrape_until(port: int, done, timeout: float = 60) -> dict[tuple[str, tuple], float]:
    """Scrape every 0.2 s until ``done(values)`` (the ranks publish every second), at most ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        values = scrape(port)
        if done(values) or time.monotonic() > deadline:
            return values
        time.sleep(0.2)


def test_launcher_serves_every_ranks_metrics_and_job_totals(tmp_path):
    port = free_port()
    stop_file = tmp_path / "stop"
    process = subprocess.Popen([sys.executable, "-m", "torchring.cli", "run", "-np", "2", "--metrics-port", str(port),
                                sys.executable, str(SCRIPTS / "metrics_train.py")], cwd=ROOT,
                               env={**os.environ, "METRICS_STOP_FILE": str(stop_file)}, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        wait_for_ready(process, 2)
        # a first snapshot once both ranks have published steps, a second once both have published more
        first = scrape_until(port, lambda values: min(steps_of_every_rank(values)) > 0)
        first_steps = steps_of_every_rank(first)
        second = scrape_until(port, lambda values: all(
            later > earlier for later, earlier in zip(steps_of_every_rank(values), first_steps, strict=True)))
    finally:
        stop_file.touch()
        out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    for rank in ("0", "1"):
        labels = {"rank": rank, "host": socket.gethostname()}
        assert value(second, "torchring_steps_total", **labels) > value(first, "torchring_steps_total", **labels) > 0
        assert (value(second, "torchring_allreduce_bytes_total", **labels)
                > value(first, "torchring_allreduce_bytes_total", **labels) > 0)
        assert value(second, "torchring_samples_total", **labels) > 0
        assert value(second, "torchring_size", **labels) == 2
        for phase in ("negotiation", "fusion_copy", "backend"):
            assert value(second, "torchring_allreduce_seconds_total", phase=phase, **labels) >= 0
        assert value(second, "torchring_allreduce_seconds_total", phase="backend", **labels) > 0
    assert value(second, "torchring_job_steps_total") > value(first, "torchring_job_steps_total")
    assert 0 < value(second, "torchring_job_response_cache_hit_rate") <= 1


def test_a_rank_serves_its_own_metrics_with_torchring_metrics_port():
    port = free_port()
    code = ("import time, torch, torchring as hvd; hvd.init(); "
            "[hvd.allreduce(torch.ones(3), name='x') for _ in range(3)]; print('ready', flush=True); time.sleep(20)")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TORCHRING_METRICS_PORT":
                               str(port)}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_ready(process, 1)
        values = scrape(port)
    finally:
        process.kill()
        process.communicate()
    assert value(values, "torchring_allreduces_total", rank="0", host=socket.gethostname()) == 3
    assert value(values, "torchring_size", rank="0", host=socket.gethostname()) == 1
