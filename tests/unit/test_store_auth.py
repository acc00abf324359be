"""Signed values in a real c10d TCPStore, the launcher's store listening on loopback only, and the
metrics page answering whatever a client wrote (issue 15)."""

import json
import logging
import pickle
import socket
import urllib.request
from datetime import timedelta

import torch.distributed as dist
from prometheus_client.parser import text_string_to_metric_families

from torchring.contract import JOB_ID, JOB_SECRET, metrics_snapshot_key
from torchring.launch.rendezvous import RendezvousServer
from torchring.launch.spawn.containers import ContainerOptions, docker_run_argv
from torchring.metrics.counters import METRICS
from torchring.metrics.exporter import serve_job_metrics
from torchring.store_auth import TAG_BYTES, JobCredentials, read_credentials, sign, verify

SECRET = b"k" * 32


def client(port: int) -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=10))


def test_a_signature_binds_secret_job_key_and_value():
    signed = sign(SECRET, "job", "a/key", b"value")
    assert len(signed) == TAG_BYTES + 5 and verify(SECRET, "job", "a/key", signed) == b"value"
    assert verify(b"other" * 8, "job", "a/key", signed) is None
    assert verify(SECRET, "other-job", "a/key", signed) is None
    assert verify(SECRET, "job", "b/key", signed) is None  # a value moved to another key
    assert verify(SECRET, "job", "a/key", signed[:-1] + b"X") is None
    assert verify(SECRET, "job", "a/key", b"short") is None


def test_forged_oversized_and_missing_values_are_ignored_with_one_warning_per_key(caplog):
    server = RendezvousServer()
    attacker = client(server.port)
    signed = server.auth
    signed.set("k/good", "hello")
    attacker.set("k/forged", pickle.dumps(object()))
    signed.set("k/big", b"x" * 100)
    signed.raw.wait(["k/forged"])  # another client's set is not answered: seen here once the server has it
    with caplog.at_level(logging.WARNING, logger="torchring"):
        assert signed.get("k/good") == b"hello"
        assert signed.get("k/forged") is None and signed.get("k/forged") is None
        assert signed.get("k/big", max_bytes=10) is None
        assert signed.get("k/missing") is None
    assert signed.rejected == {"k/forged", "k/big"}
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2 and "'k/forged'" in warnings[0] and "'k/big'" in warnings[1]


def test_a_rank_takes_the_secret_out_of_its_environment():
    credentials = JobCredentials.new()
    env = {"OTHER": "1", **credentials.environment()}
    assert read_credentials(env) == credentials and JOB_SECRET not in env and env[JOB_ID] == credentials.job_id
    assert JobCredentials.new().secret != credentials.secret


def _listening_addresses(port: int) -> list[str]:
    """Local addresses (hex, as /proc/net/tcp{,6} shows them) of sockets listening on ``port``."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in list(lines)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:
                    found.append(address)
    return found


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # no packet is sent; picks the outgoing interface
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") else address


def test_a_local_jobs_store_listens_on_loopback_only():
    server = RendezvousServer()
    assert _listening_addresses(server.port) == ["0100007F"]  # 127.0.0.1 only
    client(server.port).set("reachable", "yes")
    address = _non_loopback_address()
    if address is not None:
        with socket.socket() as outsider:
            assert outsider.connect_ex((address, server.port)) != 0


def test_the_secret_reaches_a_container_through_the_docker_clients_environment_only():
    env = {"A": "1", JOB_SECRET: "ab" * 32}
    argv = docker_run_argv(ContainerOptions(image="i", gpus=False), ["true"], env, "/", "n", from_client=(JOB_SECRET,))
    assert "A=1" in argv and JOB_SECRET in argv
    assert not any("ab" * 32 in item for item in argv)


def test_the_metrics_page_answers_with_the_good_snapshots_whatever_else_is_in_the_store():
    server = RendezvousServer()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    serve_job_metrics(server.auth, port, max_ranks=4, address="127.0.0.1")
    attacker = client(server.port)
    server.auth.set(metrics_snapshot_key(0), json.dumps({**METRICS.snapshot(), "steps": 5}))
    attacker.set(metrics_snapshot_key(1), json.dumps({**METRICS.snapshot(), "steps": 6}))  # unsigned
    server.auth.set(metrics_snapshot_key(2), json.dumps({"steps": "many"}))  # signed, malformed
    attacker.set(metrics_snapshot_key(3), b"\xff" * 10)
    server.auth.raw.wait([metrics_snapshot_key(1), metrics_snapshot_key(3)])  # the attacker's values are in
    response = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    page = response.read().decode()
    assert response.status == 200
    steps = {sample.labels["rank"]: sample.value for family in text_string_to_metric_families(page)
             for sample in family.samples if sample.name == "torchring_steps_total"}
    assert steps == {"0": 5.0}
