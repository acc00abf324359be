"""The CPU image from ``make image``: what is in it, and the seed guides' ways of running it."""

from __future__ import annotations

import re
import uuid

from .conftest import RUN_ID, docker

ACCURACY = re.compile(r"Test set: Average loss: [\d.]+, Accuracy: (0\.\d+|1\.0+)")


def run_in_image(image: str, *command: str, timeout: float = 300, options: tuple[str, ...] = ()):
    return docker("run", "--rm", "--name", f"{RUN_ID}-{uuid.uuid4().hex[:6]}", *options, image,
                  *command, timeout=timeout, check=False)


def test_the_image_runs_as_the_non_root_user_and_its_doctor_passes(image):
    result = run_in_image(image, "sh", "-c", "id -u; id -un; torchring doctor --quick")
    assert result.returncode == 0, result.stdout + result.stderr
    uid, user, *report = result.stdout.splitlines()
    assert (uid, user) == ("1000", "torchring")
    assert not re.search(r"\bFAIL\b", "\n".join(report)), result.stdout
    config = docker("image", "inspect", "--format", "{{.Config.User}} {{.Config.WorkingDir}}", image).stdout.split()
    assert config == ["1000", "/workspace"]


def test_the_image_holds_no_build_tools_caches_or_wheels(image):
    script = ("for tool in gcc cc make g++; do command -v $tool && echo found $tool; done; "
              "ls /tmp/wheelhouse /tmp/torchring /root/.cache/pip /home/torchring/.cache/pip 2>/dev/null "
              "&& echo found leftovers; ls /var/lib/apt/lists | grep -v -x -e lock -e partial; "
              "python -c 'import torch, torchring, sklearn; print(torch.__version__, torch.cuda.is_available())'")
    result = run_in_image(image, "sh", "-c", script)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "found" not in result.stdout, result.stdout
    assert result.stdout.strip().splitlines()[-1].endswith("+cpu False"), result.stdout  # the CPU build of torch


def test_torchring_run_inside_one_container_trains_the_ddp_example(image):
    # the seed guide's pattern: docker run IMAGE torchring run -np 2 python train.py
    result = run_in_image(image, "torchring", "run", "-np", "2", "python", "examples/ddp_mnist.py", "--epochs", "1")
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert ACCURACY.search(result.stdout), result.stdout[-4000:]


def test_two_containers_train_the_ddp_example_with_env_rendezvous(image):
    # The other seed pattern: one container per rank, MASTER_ADDR/PORT, RANK, WORLD_SIZE by hand, on a
    # user-defined network (whose DNS resolves container names); the image must not get in env://'s way.
    network = f"{RUN_ID}-ddp"
    docker("network", "create", network)
    names = [f"{RUN_ID}-ddp-rank{rank}" for rank in range(2)]
    try:
        for rank, name in enumerate(names):
            docker("run", "-d", "--name", name, "--hostname", name, "--network", network,
                   "-e", f"MASTER_ADDR={names[0]}", "-e", "MASTER_PORT=29500", "-e", f"RANK={rank}",
                   "-e", "WORLD_SIZE=2", "-e", f"LOCAL_RANK={rank}",
                   image, "python", "examples/ddp_mnist.py", "--epochs", "1")
        codes = [docker("wait", name, timeout=300).stdout.strip() for name in names]
        logs = [docker("logs", name).stdout + docker("logs", name).stderr for name in names]
        assert codes == ["0", "0"], logs
        assert ACCURACY.search(logs[0]), logs[0][-4000:]
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)
        docker("network", "rm", network, check=False)
