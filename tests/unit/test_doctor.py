"""``torchring doctor``: checks derived from crafted probe data, the renderings, and the probe's own parts."""

from __future__ import annotations

import copy
import json
import socket
from typing import Any

import pytest

from torchring.diagnostics.doctor import probe as doctor_probe
from torchring.diagnostics.doctor.checks import (
    ALL_HOSTS,
    NO_GPU_DETAIL,
    SHM_FIX,
    Check,
    DoctorReport,
    derive_checks,
    exit_code,
)
from torchring.diagnostics.doctor.render import render_json, render_markdown, render_text

GIB = 1024**3
CHECK_KEYS = {"host", "name", "ok", "blocking", "detail", "fix"}


def healthy(**overrides: Any) -> dict[str, Any]:
    """A probe of a CPU host where everything is fine."""
    data: dict[str, Any] = {
        "hostname": "node", "python": "3.11.7", "python_executable": "/usr/bin/python3", "torch": "2.13.0+cpu",
        "torchring": "0.1.0", "gloo_available": True,
        "cuda": {"available": False, "device_count": 0, "devices": [], "driver_version": None, "cuda_runtime": None,
                 "nccl_version": None, "cudnn": None},
        "shm": {"path": "/dev/shm", "total_bytes": 8 * GIB, "free_bytes": 8 * GIB, "ok": True},
        "interfaces": [{"name": "lo", "ipv4": "127.0.0.1"}, {"name": "eth0", "ipv4": "10.0.0.5"}],
        "ssh_address": None, "ssh_client_address": None, "peers": [], "settings": {}, "rdma": [], "container": None,
    }
    data.update(copy.deepcopy(overrides))
    return data


def find(checks: list[Check], host: str, name: str) -> Check:
    matches = [check for check in checks if check.host == host and check.name == name]
    assert len(matches) == 1, f"expected one {name!r} check of {host!r}, found {checks}"
    return matches[0]


def report_of(hosts: dict[str, dict[str, Any]]) -> DoctorReport:
    return DoctorReport(hosts, derive_checks(hosts))


def test_healthy_cpu_host_passes_everything_and_no_cuda_is_not_blocking():
    report = report_of({"a": healthy()})
    assert all(check.ok for check in report.checks), report.checks
    cuda = find(report.checks, "a", "cuda")
    assert cuda.ok and not cuda.blocking and cuda.detail == NO_GPU_DETAIL
    assert report.ok and report.exit_code == 0
    assert "torch 2.13.0+cpu" in find(report.checks, "a", "torch importable").detail


def test_small_shm_is_a_warning_with_the_fix_and_exit_code_0():
    shm = {"path": "/dev/shm", "total_bytes": 64 * 1024**2, "free_bytes": 64 * 1024**2, "ok": False}
    report = report_of({"a": healthy(shm=shm)})
    check = find(report.checks, "a", "/dev/shm")
    assert not check.ok and not check.blocking
    assert check.fix == SHM_FIX and "--ipc=host" in check.fix and "medium: Memory" in check.fix
    assert "64 MiB" in check.detail
    assert report.exit_code == 0
    text = render_text(report)
    assert f"✗ a: /dev/shm — {check.detail}\n    fix: {SHM_FIX}" in text
    assert text.splitlines()[-1].startswith("nothing blocks training")


def test_shm_that_cannot_be_measured_is_a_warning():
    shm = {"path": "/dev/shm", "total_bytes": None, "ok": False, "error": "/dev/shm: No such file or directory"}
    check = find(derive_checks({"a": healthy(shm=shm)}), "a", "/dev/shm")
    assert not check.ok and not check.blocking and "No such file" in check.detail


def test_torch_version_mismatch_across_two_hosts_is_blocking():
    report = report_of({"a": healthy(), "b": healthy(torch="2.12.0+cpu")})
    check = find(report.checks, ALL_HOSTS, "torch versions")
    assert not check.ok and check.blocking
    assert "a 2.13.0+cpu" in check.detail and "b 2.12.0+cpu" in check.detail
    assert find(report.checks, ALL_HOSTS, "torchring versions").ok
    assert report.exit_code == 1
    assert render_text(report).splitlines()[-1] == "1 problem(s) block training"


def test_torchring_version_mismatch_is_blocking():
    checks = derive_checks({"a": healthy(), "b": healthy(torchring="0.0.9")})
    check = find(checks, ALL_HOSTS, "torchring versions")
    assert not check.ok and check.blocking and exit_code(checks) == 1


def test_missing_torch_is_blocking():
    data = healthy(torch=None, torch_error="ModuleNotFoundError: No module named 'torch'", gloo_available=None,
                   gloo_available_error="ModuleNotFoundError: No module named 'torch'")
    checks = derive_checks({"a": data})
    check = find(checks, "a", "torch importable")
    assert not check.ok and check.blocking and "No module named 'torch'" in check.detail
    assert "pip install torch" in check.fix
    assert exit_code(checks) == 1


def test_remote_host_whose_python_cannot_import_torch_is_blocking():
    data = {"error": "python3 failed there (exit 1): ImportError: libtorch_cpu.so: cannot open shared object file",
            "error_kind": "torch_broken"}
    checks = derive_checks({"a": healthy(), "b": data})
    check = find(checks, "b", "torch importable")
    assert not check.ok and check.blocking and exit_code(checks) == 1


def test_unreachable_host_is_blocking_with_the_ssh_fix():
    data = {"error": "SSH failed: ssh: connect to host b port 22: Connection refused", "error_kind": "unreachable"}
    report = report_of({"a": healthy(), "b": data})
    check = find(report.checks, "b", "reachable over SSH")
    assert not check.ok and check.blocking
    assert "Connection refused" in check.detail and "`ssh b true`" in check.fix
    assert [c.name for c in report.checks if c.host == "b"] == ["reachable over SSH"]
    assert report.exit_code == 1
    # one host left to compare with: no version checks
    assert not [c for c in report.checks if c.host == ALL_HOSTS]


def test_unreachable_peer_is_blocking_and_names_the_peer():
    peers = [{"address": "10.0.0.6", "port": 22, "reachable": False, "error": "timed out", "host": "b"}]
    checks = derive_checks({"a": healthy(peers=peers), "b": healthy()})
    check = find(checks, "a", "reaches peers")
    assert not check.ok and check.blocking and "b at 10.0.0.6:22 (timed out)" in check.detail
    assert "--network-interface" in check.fix and "firewall" in check.fix
    assert exit_code(checks) == 1


def test_reachable_peers_pass():
    peers = [{"address": "10.0.0.6", "port": 22, "reachable": True, "host": "b"}]
    check = find(derive_checks({"a": healthy(peers=peers), "b": healthy()}), "a", "reaches peers")
    assert check.ok and "b (10.0.0.6)" in check.detail


def test_missing_gloo_is_blocking():
    check = find(derive_checks({"a": healthy(gloo_available=False)}), "a", "gloo")
    assert not check.ok and check.blocking


def test_driver_without_usable_cuda_is_a_warning():
    cuda = {"available": False, "device_count": 0, "devices": [], "driver_version": "550.54.15", "cuda_runtime": None,
            "nccl_version": None, "cudnn": None}
    checks = derive_checks({"a": healthy(cuda=cuda)})
    check = find(checks, "a", "cuda")
    assert not check.ok and not check.blocking and "550.54.15" in check.detail
    assert exit_code(checks) == 0


def test_gpu_host_reports_devices_and_nccl():
    cuda = {"available": True, "device_count": 2, "devices": ["NVIDIA H100", "NVIDIA H100"],
            "driver_version": "550.54.15", "cuda_runtime": "12.4", "nccl_version": "2.21.5", "cudnn": 90100}
    checks = derive_checks({"a": healthy(cuda=cuda)})
    assert "2 GPU(s) (NVIDIA H100)" in find(checks, "a", "cuda").detail
    assert find(checks, "a", "nccl").detail == "NCCL 2.21.5"


def test_informational_checks_never_block():
    data = healthy(rdma=["mlx5_0"], container={"runtime": "kubernetes", "evidence": "KUBERNETES_SERVICE_HOST is set"},
                   settings={"NCCL_DEBUG": "INFO", "OMP_NUM_THREADS": "4"})
    checks = derive_checks({"a": data})
    assert find(checks, "a", "rdma").detail == "mlx5_0"
    assert find(checks, "a", "container").detail.startswith("kubernetes")
    assert find(checks, "a", "settings").detail == "NCCL_DEBUG=INFO, OMP_NUM_THREADS=4"
    assert all(not c.blocking for c in checks if c.name in {"rdma", "container", "settings"})


def test_json_rendering_has_ok_hosts_and_complete_checks():
    hosts = {"a": healthy(), "b": {"error": "SSH failed: timed out", "error_kind": "unreachable"}}
    data = json.loads(render_json(report_of(hosts)))
    assert set(data) == {"ok", "hosts", "checks"}
    assert data["ok"] is False and data["hosts"] == hosts
    assert data["checks"] and all(set(check) == CHECK_KEYS for check in data["checks"])


def test_markdown_rendering_has_a_table_and_the_raw_json_collapsed():
    shm = {"path": "/dev/shm", "total_bytes": GIB // 2, "ok": False}
    markdown = render_markdown(report_of({"a": healthy(shm=shm, settings={"NCCL_SOCKET_IFNAME": "eth0|eth1"})}))
    lines = markdown.splitlines()
    assert "| host | check | status | detail | fix |" in lines
    assert "|---|---|---|---|---|" in lines
    assert any(line.startswith("| a | /dev/shm | ✗ warning |") for line in lines)
    assert "eth0\\|eth1" in markdown  # a | inside a cell does not split it
    assert "<details>" in markdown and "</details>" in markdown
    raw = markdown.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(raw)["hosts"]["a"]["shm"]["total_bytes"] == GIB // 2


# ------------------------------------------------------------------------------------ the probe's parts

def test_probe_of_this_host_is_json_and_complete():
    data = doctor_probe.probe(quick=True)
    json.dumps(data)
    for key in ("hostname", "python", "torch", "torchring", "cuda", "gloo_available", "shm", "interfaces",
                "peers", "settings", "rdma", "container"):
        assert key in data, key
    assert data["torchring"] == __import__("torchring").__version__
    assert {"available", "device_count", "devices", "driver_version", "cuda_runtime", "nccl_version",
            "cudnn"} <= set(data["cuda"])
    assert all(set(entry) == {"name", "ipv4"} for entry in data["interfaces"])
    checks = derive_checks({"here": data})
    assert find(checks, "here", "torch importable").ok


def test_probe_shm_of_a_missing_path_reports_instead_of_raising(tmp_path):
    missing = doctor_probe.probe_shm(str(tmp_path / "missing"))
    assert missing["ok"] is False and missing["total_bytes"] is None and "error" in missing
    present = doctor_probe.probe_shm(str(tmp_path))
    assert present["total_bytes"] > 0 and present["ok"] == (present["total_bytes"] >= GIB)


def test_probe_peers_tells_a_listening_port_from_a_closed_one():
    with socket.socket() as listener, socket.socket() as closed:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        results = doctor_probe.probe_peers(["127.0.0.1"], listener.getsockname()[1])
        refused = doctor_probe.probe_peer("127.0.0.1", closed.getsockname()[1])
    assert results[0]["reachable"] is True
    assert refused["reachable"] is False and refused["error"]
    assert doctor_probe.probe_peer("not a host name!", 22)["reachable"] is False


def test_settings_pick_the_documented_variables(monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    monkeypatch.setenv("TORCHRING_FUSION_THRESHOLD", "1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("UNRELATED_VARIABLE", "x")
    settings = doctor_probe.probe_settings()
    assert {"NCCL_DEBUG": "WARN", "TORCHRING_FUSION_THRESHOLD": "1", "CUDA_VISIBLE_DEVICES": "0"}.items() <= \
        settings.items()
    assert "UNRELATED_VARIABLE" not in settings


def test_rdma_of_a_missing_directory_is_empty(tmp_path):
    assert doctor_probe.probe_rdma(str(tmp_path / "none")) == []
    (tmp_path / "mlx5_1").mkdir()
    (tmp_path / "mlx5_0").mkdir()
    assert doctor_probe.probe_rdma(str(tmp_path)) == ["mlx5_0", "mlx5_1"]


@pytest.mark.parametrize(("version", "text"), [((2, 19, 3), "2.19.3"), (21903, "2.19.3"), (2708, "2.7.8"),
                                               (None, None)])
def test_nccl_version_formats(version, text):
    assert doctor_probe._format_nccl(version) == text
