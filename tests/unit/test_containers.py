"""``docker run`` command lines for ranks in containers (torchring.launch.spawn.containers): no Docker needed."""

import json

import pytest

from torchring.launch.spawn.containers import (
    CONTAINER_NAME_RE,
    ContainerOptions,
    container_name,
    docker_run_argv,
    stop_argv,
)

AWKWARD = ["a b", "it's", 'say "hi"', "$HOME", "x; rm -rf /", "`id`", "back\\slash", "tab\tand\nnewline", ""]
ENV = {"TORCHRING_RANK": "3", "MASTER_ADDR": "10.0.0.1"}
COMMAND = ["python", "train.py", "--epochs", "1"]


def test_gpu_argv_with_host_ipc_and_host_network():
    options = ContainerOptions(image="torchring:cuda", gpus=True)
    argv = docker_run_argv(options, COMMAND, ENV, "/workspace", "torchring-j-rank3")
    assert argv == ["docker", "run", "--rm", "--init", "--name", "torchring-j-rank3", "--gpus", "all",
                    "--ulimit", "memlock=-1", "--ulimit", "stack=67108864", "--ipc=host", "--network", "host",
                    "-e", "TORCHRING_RANK=3", "-e", "MASTER_ADDR=10.0.0.1", "-w", "/workspace",
                    "torchring:cuda", *COMMAND]


def test_cpu_argv_with_shm_size_bridge_network_volumes_and_extra_args():
    options = ContainerOptions(image="registry.example/torchring:cpu", gpus=False, shm_size="8g", network_host=False,
                               volumes=("/data:/data:ro", "/scratch:/scratch"), extra_args=("--user", "1000:1000"))
    argv = docker_run_argv(options, COMMAND, {}, "/workspace/job", "n")
    assert argv == ["docker", "run", "--rm", "--init", "--name", "n", "--shm-size", "8g",
                    "-v", "/data:/data:ro", "-v", "/scratch:/scratch", "-w", "/workspace/job",
                    "--user", "1000:1000", "registry.example/torchring:cpu", *COMMAND]
    assert "--gpus" not in argv and "--ipc=host" not in argv and "--network" not in argv


def test_gpus_are_decided_per_host_unless_set():
    auto = ContainerOptions(image="i")
    assert auto.gpus is None
    assert "--gpus" in docker_run_argv(auto.for_host(True), ["true"], {}, "/", "n")
    assert "--gpus" not in docker_run_argv(auto.for_host(False), ["true"], {}, "/", "n")
    assert ContainerOptions(image="i", gpus=False).for_host(True).gpus is False  # --image-no-gpus wins
    with pytest.raises(ValueError, match="for_host"):
        docker_run_argv(auto, ["true"], {}, "/", "n")


def test_shm_size_replaces_host_ipc():
    with_ipc = docker_run_argv(ContainerOptions(image="i", gpus=False), ["true"], {}, "/", "n")
    with_shm = docker_run_argv(ContainerOptions(image="i", shm_size="1gb", gpus=False), ["true"], {}, "/", "n")
    assert "--ipc=host" in with_ipc and "--shm-size" not in with_ipc
    assert "--ipc=host" not in with_shm and with_shm[with_shm.index("--shm-size") + 1] == "1gb"


def test_sig_proxy_false_and_another_client():
    argv = docker_run_argv(ContainerOptions(image="i", gpus=False), ["true"], {}, "/", "n", sig_proxy=False,
                           docker="/usr/bin/podman")
    assert argv[:7] == ["/usr/bin/podman", "run", "--rm", "--init", "--name", "n", "--sig-proxy=false"]
    assert "--sig-proxy=false" not in docker_run_argv(ContainerOptions(image="i", gpus=False), ["true"], {}, "/", "n")


def test_awkward_env_values_and_arguments_stay_single_argv_items():
    env = {f"V{index}": value for index, value in enumerate(AWKWARD)}
    argv = docker_run_argv(ContainerOptions(image="i", gpus=False), ["python", "-c", "pass", *AWKWARD], env, "/w", "n")
    pairs = [argv[index + 1] for index, item in enumerate(argv) if item == "-e"]
    assert pairs == [f"V{index}={value}" for index, value in enumerate(AWKWARD)]
    assert argv[-len(AWKWARD):] == AWKWARD
    # values whose text looks like an option or an "=" stay the value of their own -e
    argv = docker_run_argv(ContainerOptions(image="i", gpus=False), ["true"], {"A": "--rm", "B": "x=y=z"}, "/", "n")
    assert argv[argv.index("-e"):argv.index("-w")] == ["-e", "A=--rm", "-e", "B=x=y=z"]


def test_argv_survives_a_json_round_trip_unchanged():
    options = ContainerOptions(image="torchring:cuda", gpus=True, shm_size="2g", volumes=("/d a/t:/data",),
                               extra_args=("--x",))
    env = {f"V{index}": value for index, value in enumerate(AWKWARD)}
    argv = docker_run_argv(options, ["python", "train.py", *AWKWARD], env, "/workspace", container_name("j", 0))
    spec = json.dumps({"command": argv, "env": {"PATH": "/usr/bin"}, "cwd": None})
    assert json.loads(spec)["command"] == argv
    assert all(isinstance(item, str) for item in argv)


@pytest.mark.parametrize("job_id", ["job-1", "2024-06-01T12:00:00Z", "my job/with spaces", "-leading", "ünïcode",
                                    "...", "a" * 300, "_x_", "x\0y"])
@pytest.mark.parametrize("rank", [0, 7, 123])
def test_container_names_are_valid_docker_names(job_id, rank):
    name = container_name(job_id, rank)
    assert CONTAINER_NAME_RE.fullmatch(name), name
    assert name.startswith("torchring-") and name.endswith(f"-rank{rank}")
    assert len(name) < 100
    assert stop_argv(name) == ["docker", "stop", "-t", "5", name]


def test_container_names_keep_clean_job_ids_and_separate_different_ones():
    assert container_name("job-1", 2) == "torchring-job-1-rank2"
    names = {container_name(job_id, 0) for job_id in ["a/b", "a b", "a_b", "a-b", "a" * 300, "a" * 301]}
    assert len(names) == 6
    assert container_name("j", 0) != container_name("j", 1)
    assert container_name("a/b", 0) == container_name("a/b", 0)


@pytest.mark.parametrize("job_id, rank", [("", 0), ("j", -1), ("j", True), ("j", 1.0), (None, 0)])
def test_container_name_rejects_bad_input(job_id, rank):
    with pytest.raises(ValueError):
        container_name(job_id, rank)


def test_stop_argv():
    assert stop_argv("torchring-j-rank0") == ["docker", "stop", "-t", "5", "torchring-j-rank0"]
    assert stop_argv("n", 30, docker="podman") == ["podman", "stop", "-t", "30", "n"]
    for bad in ["", "-rm", "a b", "a/b", "_x"]:
        with pytest.raises(ValueError):
            stop_argv(bad)
    with pytest.raises(ValueError):
        stop_argv("n", -1)


@pytest.mark.parametrize("kwargs", [{"image": ""}, {"image": "--privileged"}, {"image": "a b"},
                                    {"image": "i", "shm_size": "lots"}, {"image": "i", "shm_size": "1g; rm"},
                                    {"image": "i", "volumes": ("-v",)}, {"image": "i", "volumes": ("",)}])
def test_options_reject_bad_values(kwargs):
    with pytest.raises(ValueError):
        ContainerOptions(**kwargs)


def test_options_want_sequences_not_strings_and_store_tuples():
    with pytest.raises(TypeError):
        ContainerOptions(image="i", volumes="/data:/data")
    with pytest.raises(TypeError):
        ContainerOptions(image="i", extra_args="--privileged")
    options = ContainerOptions(image="i", volumes=["/a:/a"], extra_args=["--x"])
    assert options.volumes == ("/a:/a",) and options.extra_args == ("--x",)
    assert hash(options) == hash(ContainerOptions(image="i", volumes=("/a:/a",), extra_args=("--x",)))


@pytest.mark.parametrize("command, env, workdir, name", [
    ("python train.py", {}, "/w", "n"), ([], {}, "/w", "n"), (["true"], {}, "relative", "n"),
    (["true"], {"A=B": "x"}, "/w", "n"), (["true"], {"": "x"}, "/w", "n"), (["true"], {"A": 1}, "/w", "n"),
    (["true"], {"A": "x\0y"}, "/w", "n"), (["true"], {}, "/w", "bad name"), (["true"], {}, "/w", "-n"),
])
def test_docker_run_argv_rejects_bad_input(command, env, workdir, name):
    with pytest.raises(ValueError):
        docker_run_argv(ContainerOptions(image="i", gpus=False), command, env, workdir, name)
