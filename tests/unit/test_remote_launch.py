"""The pieces of remote launch that need no remote host: quoting, environment, preflight verdicts and
the remote supervisor (run here as a local process, the way sshd would run it)."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

from torchring.launch.spawn.rank_env import forwarded_environment
from torchring.launch.spawn.ssh import HostReport, SshOptions, preflight_problems, ssh_argv
from torchring.launch.spawn.worker import describe_returncode

AWKWARD = ["a b", "it's", 'say "hi"', "$HOME", "x; rm -rf /", "`id`", "back\\slash", "tab\tand\nnewline", ""]


def test_ssh_argv_quotes_the_remote_command_as_one_shell_word_list():
    argv = ssh_argv("h1", ["/opt/my python/bin/python", "-m", "mod", *AWKWARD],
                    SshOptions(port=2222, identity_file="/keys/id rsa", connect_timeout_s=7.5))
    assert argv[:argv.index("h1")] == ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=7", "-o",
                                       "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-p", "2222",
                                       "-i", "/keys/id rsa"]
    assert argv[-2] == "--"
    # what the remote shell will split the line into: exactly the arguments given
    assert shlex.split(argv[-1]) == ["/opt/my python/bin/python", "-m", "mod", *AWKWARD]


def test_the_remote_shell_really_receives_awkward_arguments_unchanged():
    line = ssh_argv("h1", [sys.executable, "-c", "import sys, json; print(json.dumps(sys.argv[1:]))", *AWKWARD],
                    SshOptions())[-1]
    result = subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=True)
    assert json.loads(result.stdout) == AWKWARD


def test_forwarded_environment_keeps_the_usual_variables_and_the_asked_ones():
    environ = {"PATH": "/bin", "PYTHONPATH": "/p", "LD_LIBRARY_PATH": "/l", "NCCL_DEBUG": "INFO",
               "GLOO_SOCKET_IFNAME": "eth0", "TORCH_SHOW_CPP_STACKTRACES": "1", "OMP_NUM_THREADS": "2",
               "HOROVOD_FUSION_THRESHOLD": "0", "HOME": "/root", "SECRET_TOKEN": "x", "WANDB_API_KEY": "k"}
    env = forwarded_environment(environ, ["WANDB_API_KEY"], {"MY_FLAG": "a=b c"})
    assert env == {"PATH": "/bin", "PYTHONPATH": "/p", "LD_LIBRARY_PATH": "/l", "NCCL_DEBUG": "INFO",
                   "GLOO_SOCKET_IFNAME": "eth0", "TORCH_SHOW_CPP_STACKTRACES": "1", "OMP_NUM_THREADS": "2",
                   "HOROVOD_FUSION_THRESHOLD": "0", "WANDB_API_KEY": "k", "MY_FLAG": "a=b c"}


def _report(host, **fields):
    defaults = {"python": "3.11.7", "torch": "2.13.0", "torchring": "0.1.0", "store_reachable": True,
                "launcher_address": "10.0.0.1"}
    return HostReport(host, **{**defaults, **fields})


def test_preflight_passes_when_every_host_matches():
    reports = {"a": _report("a"), "b": _report("b")}
    assert preflight_problems(reports, ("3.11.7", "2.13.0", "0.1.0")) == []


def test_preflight_names_unreachable_hosts_and_version_mismatches():
    reports = {"a": _report("a"), "b": HostReport("b", error="SSH failed: ssh: connect to host b port 22: No route"),
               "c": _report("c", torch="2.12.1")}
    problems = preflight_problems(reports, ("3.11.7", "2.13.0", "0.1.0"))
    assert problems[0] == "host b: SSH failed: ssh: connect to host b port 22: No route"
    assert "different versions" in problems[1]
    assert "this host: Python 3.11.7, torch 2.13.0, torchring 0.1.0" in problems[1]
    assert "c: Python 3.11.7, torch 2.12.1, torchring 0.1.0" in problems[1]
    assert len(problems) == 2


def test_preflight_reports_missing_packages_and_an_unreachable_store():
    reports = {"a": _report("a", torchring=None), "b": _report("b", store_reachable=False,
                                                               store_error="10.0.0.1:555: Connection refused")}
    problems = preflight_problems(reports, ("3.11.7", "2.13.0", "0.1.0"))
    assert problems[0].startswith("host a: torchring cannot be imported")
    assert problems[1].startswith("host b cannot reach the launcher's rendezvous store (10.0.0.1:555: Connection")
    assert "--network-interface" in problems[1]


def test_remote_exit_codes_are_described_as_signals_or_lost_connections():
    assert describe_returncode(137, remote=True) == "was killed by signal 9 (SIGKILL)"
    assert describe_returncode(255, remote=True) == "lost its SSH connection (ssh exited with 255)"
    assert describe_returncode(3, remote=True) == "exited with code 3"
    assert describe_returncode(137) == "exited with code 137"


def _start_remote_rank(command, env=None, cwd=None):
    process = subprocess.Popen([sys.executable, "-m", "torchring.launch.spawn.remote_rank"], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    spec = {"command": command, "env": {**os.environ, **(env or {})}, "cwd": cwd or os.getcwd()}
    process.stdin.write((json.dumps(spec) + "\n").encode())
    process.stdin.flush()
    return process


def _finish(process):
    """Wait for the rank to end by itself (the channel stays open meanwhile, as over SSH)."""
    out, err = process.stdout.read(), process.stderr.read()
    process.wait(timeout=30)
    process.stdin.close()
    return out, err


def test_remote_rank_runs_the_command_with_its_arguments_environment_and_directory(tmp_path):
    code = "import json, os, sys; print(json.dumps([sys.argv[1:], os.environ['ODD'], os.getcwd()]))"
    process = _start_remote_rank([sys.executable, "-c", code, *AWKWARD], env={"ODD": "$x 'y' ;z"},
                                 cwd=str(tmp_path))
    out, _ = _finish(process)
    args, odd, cwd = json.loads(out)
    assert args == AWKWARD and odd == "$x 'y' ;z" and cwd == str(tmp_path)


def test_remote_rank_kills_the_whole_group_when_the_channel_closes(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    process = _start_remote_rank(["sh", "-c", f"sleep 300 & echo $! > {pid_file}; wait"])
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    grandchild = int(pid_file.read_text())
    process.stdin.close()  # what happens when the launcher or the SSH connection goes away
    assert process.wait(timeout=10) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{grandchild}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not os.path.exists(f"/proc/{grandchild}") or open(f"/proc/{grandchild}/stat").read().split()[2] == "Z"


def test_remote_rank_reports_a_missing_directory_and_command(tmp_path):
    process = _start_remote_rank(["true"], cwd=str(tmp_path / "nowhere"))
    _, err = _finish(process)
    assert process.returncode == 127 and b"does not exist on this host" in err
    process = _start_remote_rank(["no-such-program-xyz"])
    _, err = _finish(process)
    assert process.returncode == 127 and b"cannot start 'no-such-program-xyz'" in err


def test_remote_rank_passes_on_exit_codes_and_signals():
    process = _start_remote_rank([sys.executable, "-c", "import sys; sys.exit(7)"])
    _finish(process)
    assert process.returncode == 7
    process = _start_remote_rank([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    _finish(process)
    assert process.returncode == 128 + signal.SIGKILL


def test_the_host_probe_runs_as_a_module_and_reports_the_store_and_the_interface_without_importing_torch():
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        code = ("import runpy, sys; sys.argv = ['host_probe', sys.argv[1], '2', '']; "
                "runpy.run_module('torchring.launch.spawn.host_probe', run_name='__main__'); "
                "print('torch imported' if 'torch' in sys.modules else 'torch not imported')")
        env = {**os.environ, "SSH_CONNECTION": "127.0.0.1 50000 127.0.0.1 22"}
        result = subprocess.run([sys.executable, "-c", code, str(port)], capture_output=True, text=True, env=env,
                                check=True, timeout=60)
    report_line, torch_line = result.stdout.strip().splitlines()
    report = json.loads(report_line)
    assert report["launcher_address"] == "127.0.0.1" and report["store_reachable"] is True
    assert report["interface"] == "lo" and report["torchring"] and report["cpus"] >= 1
    assert torch_line == "torch not imported"


def test_the_launchers_own_versions_are_read_as_the_hosts_read_theirs_without_importing_torch():
    code = ("import sys; from torchring.launch.spawn.preflight import local_versions; "
            "print(*local_versions()); print('torch imported' if 'torch' in sys.modules else 'torch not imported'); "
            "import torch, torchring, platform; print(platform.python_version(), torch.__version__, "
            "torchring.__version__)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    versions, torch_line, imported = result.stdout.strip().splitlines()
    assert torch_line == "torch not imported"
    assert versions == imported
