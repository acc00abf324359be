"""``torchring run --image``: every rank starts as ``docker run ...`` under the rank supervisor, and each
container is stopped afterwards. A stand-in ``docker`` client runs the command as the container would."""

import json
import os
import stat
import sys

from .jobs import SCRIPTS, run_job


def fake_docker(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    docker = bin_dir / "docker"
    docker.write_text(f"#!{sys.executable}\n" + (SCRIPTS / "fake_docker.py").read_text())
    docker.chmod(docker.stat().st_mode | stat.S_IEXEC)
    return bin_dir, tmp_path / "docker.log"


def test_ranks_run_in_containers_and_are_stopped_after(tmp_path):
    bin_dir, log = fake_docker(tmp_path)
    code = ("import json, os, torchring as hvd, torch; hvd.init(); "
            "print(json.dumps([hvd.rank(), hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), os.getcwd(), "
            "os.environ.get('RANK'), os.environ.get('MY_SETTING'), os.environ['PATH']])); hvd.shutdown()")
    result = run_job("run", "-np", "2", "--image", "registry.example/train:1", "--image-no-gpus", "--image-workdir",
                     str(tmp_path), "--image-shm-size", "2g", "--image-volume", "/data:/data", "--env",
                     "MY_SETTING=a b $c", sys.executable, "-c", code,
                     env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    for rank in (0, 1):
        got = json.loads(result.lines("stdout", rank)[0])
        assert got[:5] == [rank, 2.0, str(tmp_path), str(rank), "a b $c"]
        assert got[5] == os.defpath  # the image's PATH, not the host's
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    runs = [c for c in calls if c[0] == "run"]
    stops = sorted(c for c in calls if c[0] == "stop")
    assert len(runs) == 2 and len(stops) == 2
    for run in runs:
        assert run[:3] == ["run", "--rm", "--init"]
        assert "--gpus" not in run and ["--shm-size", "2g"] == run[run.index("--shm-size"):run.index("--shm-size") + 2]
        assert "--ipc=host" not in run and ["-v", "/data:/data"] == run[run.index("-v"):run.index("-v") + 2]
        assert ["--network", "host"] == run[run.index("--network"):run.index("--network") + 2]
        assert not any(item.startswith("PATH=") for item in run)
        name = run[run.index("--name") + 1]
        assert ["stop", "-t", "5", name] in stops


def test_elastic_workers_run_in_containers_with_their_output_files(tmp_path):
    bin_dir, log = fake_docker(tmp_path)
    code = ("import os, torchring as hvd, torch; hvd.init(); "
            "print(os.environ['TORCHRING_WORKER_ID'], hvd.allreduce(torch.ones(1), op=hvd.Sum).item(), os.getcwd()); "
            "hvd.shutdown()")
    out = tmp_path / "out"
    result = run_job("run", "--min-np", "2", "--max-np", "2", "-H", "localhost:2", "--image", "train:1",
                     "--image-no-gpus", "--image-workdir", str(tmp_path), "--output-filename", str(out),
                     sys.executable, "-c", code, env={"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"})
    assert result.returncode == 0, result.stderr
    for number in (0, 1):
        assert (out / f"worker.{number}" / "stdout").read_text() == f"w{number} 2.0 {tmp_path}\n"
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    names = sorted(run[run.index("--name") + 1] for run in calls if run[0] == "run")
    assert len(names) == 2 and all(name.startswith("torchring-") for name in names)
    assert [name[-8:] for name in names] == ["-worker0", "-worker1"]
    assert sorted(c[-1] for c in calls if c[0] == "stop") == names
