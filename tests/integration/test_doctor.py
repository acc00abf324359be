"""``torchring doctor`` on this machine for real: the command line, its outputs and exit codes, and the
two SSH rounds through a stand-in ``ssh`` that runs the real probe locally."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from torchring.diagnostics.doctor import cli as doctor_cli
from torchring.diagnostics.doctor.checks import ALL_HOSTS, collect
from torchring.launch.spawn.ssh import SshOptions
from torchring.version import __version__

NOBODY = "10.255.255.1"  # an address nobody answers: SSH times out


def doctor(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchring.diagnostics.doctor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def torch_version() -> str:
    import torch

    return torch.__version__


def test_this_machine_passes_and_mentions_no_gpu_and_the_torch_version():
    result = doctor()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no GPU" in result.stdout
    assert torch_version() in result.stdout
    assert result.stdout.strip().splitlines()[-1].startswith("nothing blocks training")
    assert all(line.startswith(("✓ ", "✗ ", "    fix: ", "torchring doctor:", "nothing blocks"))
               for line in result.stdout.splitlines() if line.strip())


def doctor_in_process(capsys, *args: str) -> tuple[int, str, str]:
    """The doctor's command line run in this process: (exit code, stdout, stderr)."""
    code = doctor_cli.main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_output_parses_and_is_ok(capsys):
    code, out, err = doctor_in_process(capsys, "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] is True
    (probe,) = data["hosts"].values()
    assert probe["torch"] == torch_version() and probe["torchring"] == __version__
    assert all({"host", "name", "ok", "blocking", "detail", "fix"} == set(check) for check in data["checks"])


def _import_seconds() -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", "import torch, torchring"], check=True, timeout=120)
    return time.monotonic() - start


def test_quick_is_fast_enough_for_a_healthcheck():
    # Starting Python and importing torch is most of it (the probe does it): 5 s, or on a machine so busy
    # that loading torch takes more than 2 s, 2.5 times that (timed just before and just after).
    before = _import_seconds()
    start = time.monotonic()
    result = doctor("--quick", "--json")
    elapsed = time.monotonic() - start
    import_seconds = max(before, _import_seconds())
    budget = max(5.0, 2.5 * import_seconds)
    assert result.returncode == 0, result.stderr
    assert elapsed < budget, f"--quick took {elapsed:.1f} s (budget {budget:.1f} s)"
    (probe,) = json.loads(result.stdout)["hosts"].values()
    # the probe imports torch itself (``import torchring`` does not): beyond that, under a second
    assert probe["probe_seconds"] < 1.0 + import_seconds


def test_unreachable_host_exits_1_and_names_it(capsys):
    code, out, err = doctor_in_process(capsys, "-H", NOBODY, "--start-timeout", "1")
    assert code == 1, out + err
    assert f"✗ {NOBODY}: " in out
    assert f"ssh {NOBODY} true" in out
    assert out.strip().splitlines()[-1] == "1 problem(s) block training"


def test_markdown_output_has_a_table(capsys):
    code, out, err = doctor_in_process(capsys, "--markdown")
    assert code == 0, err
    assert "| host | check | status | detail | fix |" in out
    assert "<details>" in out and "```json" in out


def test_unusable_flags_exit_2_with_a_message(capsys):
    code, _, err = doctor_in_process(capsys, "--quick", "-H", "a,b")
    assert code == 2 and "--quick" in err


# A stand-in for ssh: runs the remote command locally, with SSH_CONNECTION saying which address the host
# was reached at; a host mapped to null "cannot be reached".
FAKE_SSH = """\
#!{python}
import json, os, subprocess, sys
args = sys.argv[1:]
host, command = args[args.index("--") - 1], args[args.index("--") + 1]
address = json.loads(os.environ["DOCTOR_TEST_HOSTS"])[host]
if address is None:
    print(f"ssh: connect to host {{host}} port 22: No route to host", file=sys.stderr)
    sys.exit(255)
env = dict(os.environ, SSH_CONNECTION=f"127.0.0.1 50000 {{address}} 22")
sys.exit(subprocess.call(["sh", "-c", command], env=env))
"""


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    script = tmp_path / "ssh"
    script.write_text(textwrap.dedent(FAKE_SSH).format(python=sys.executable))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")

    def hosts(mapping: dict[str, str | None]) -> None:
        monkeypatch.setenv("DOCTOR_TEST_HOSTS", json.dumps(mapping))

    return hosts


def test_two_rounds_over_ssh_find_unreachable_hosts_and_peers(fake_ssh):
    # node-a answers at 127.0.0.1, where the "SSH port" listens; node-b at 127.0.0.3, where nothing does.
    fake_ssh({"node-a.invalid": "127.0.0.1", "node-b.invalid": "127.0.0.3", "node-c.invalid": None})
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        options = SshOptions(port=listener.getsockname()[1], connect_timeout_s=120, python=sys.executable)
        report = collect(["localhost", "node-a.invalid", "node-b.invalid", "node-c.invalid"], options)
    checks = {(check.host, check.name): check for check in report.checks}

    assert report.hosts["node-a.invalid"]["probed"] == "ssh"
    assert report.hosts["node-a.invalid"]["ssh_address"] == "127.0.0.1"
    assert report.hosts["node-a.invalid"]["torch"] == torch_version()
    unreachable = checks[("node-c.invalid", "reachable over SSH")]
    assert not unreachable.ok and unreachable.blocking and "No route to host" in unreachable.detail

    # localhost is tested at the address the remote hosts' SSH client came from (127.0.0.1: reachable)
    for source in ("localhost", "node-a.invalid"):
        peers = checks[(source, "reaches peers")]
        assert not peers.ok and peers.blocking and "node-b.invalid at 127.0.0.3" in peers.detail
    assert checks[("node-b.invalid", "reaches peers")].ok
    assert {entry["host"] for entry in report.hosts["node-b.invalid"]["peers"]} == {"localhost", "node-a.invalid"}

    assert checks[(ALL_HOSTS, "torch versions")].ok
    assert report.exit_code == 1
