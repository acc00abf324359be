"""Elastic pieces that need no job: the checkpoint file, the sampler's partition, host-version parsing."""

from __future__ import annotations

import pytest
import torch

from torchring.elastic import ElasticSampler
from torchring.elastic.checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from torchring.elastic.membership import HostsVersion, parse_hosts_version


def test_checkpoint_round_trip_replaces_the_previous_file(tmp_path):
    write_checkpoint(tmp_path, {"epoch": 1, "weights": torch.ones(3)}, commit_count=1)
    write_checkpoint(tmp_path, {"epoch": 2, "weights": torch.zeros(3)}, commit_count=2)
    payload = read_checkpoint(tmp_path)
    assert payload["commits"] == 2 and payload["state"]["epoch"] == 2
    assert torch.equal(payload["state"]["weights"], torch.zeros(3))
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]


def test_failed_write_keeps_the_old_checkpoint_and_leaves_no_temporary_file(tmp_path):
    write_checkpoint(tmp_path, {"epoch": 1}, commit_count=1)

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("cannot pickle")

    with pytest.raises(RuntimeError, match="cannot pickle"):
        write_checkpoint(tmp_path, {"epoch": Unpicklable()}, commit_count=2)
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]
    assert read_checkpoint(tmp_path)["state"] == {"epoch": 1}


def test_missing_and_corrupt_checkpoints(tmp_path):
    assert read_checkpoint(tmp_path) is None
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(RuntimeError, match="cannot read the elastic checkpoint"):
        read_checkpoint(tmp_path)


def test_sampler_before_init_covers_the_dataset_once():
    sampler = ElasticSampler(list(range(7)), shuffle=False)
    assert list(sampler) == list(range(7)) and len(sampler) == 7
    sampler.record_batch(0, 3)
    assert sampler.state_dict() == {"epoch": 0, "processed_num": 3}
    sampler.load_state_dict(sampler.state_dict())
    assert list(sampler) == [3, 4, 5, 6] and len(sampler) == 4
    sampler.record_indices([5])
    sampler.load_state_dict(sampler.state_dict())
    assert list(sampler) == [3, 4, 6]
    shuffled = ElasticSampler(list(range(50)), shuffle=True, seed=1)
    assert sorted(shuffled) == list(range(50)) and list(shuffled) != list(range(50))


def test_hosts_version_parsing():
    assert parse_hosts_version("3 removed") == HostsVersion(3, True)
    assert parse_hosts_version("4 added") == HostsVersion(4, False)
    assert parse_hosts_version("") == HostsVersion()
    assert parse_hosts_version("garbage") is None


def test_a_writer_killed_midway_leaves_the_previous_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    write_checkpoint(tmp_path, {"epoch": 1}, commit_count=1)
    # a writer whose disk stalls after part of the new file is written: killed there
    child = subprocess.Popen([sys.executable, "-c", f"""
import os, time, torch
from pathlib import Path
from torchring.elastic import checkpoint
real_fdopen = os.fdopen
class Stalling:
    def __init__(self, handle): self.handle = handle
    def __enter__(self): return self
    def __exit__(self, *a): return self.handle.__exit__(*a)
    def write(self, data):
        self.handle.write(bytes(data)[: len(data) // 2]); self.handle.flush()
        Path({str(tmp_path)!r}, "halfway").touch()
        time.sleep(60)
checkpoint.os.fdopen = lambda fd, mode: Stalling(real_fdopen(fd, mode))
checkpoint.write_checkpoint(Path({str(tmp_path)!r}), {{"epoch": 2, "weights": torch.ones(100000)}}, commit_count=2)
"""])
    deadline = time.monotonic() + 60
    while not (tmp_path / "halfway").exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    leftovers = list(tmp_path.glob(f".{CHECKPOINT_FILE}.*.tmp"))
    assert len(leftovers) == 1 and leftovers[0].stat().st_size > 0  # the torn new file, never renamed
    assert read_checkpoint(tmp_path)["state"] == {"epoch": 1}
    write_checkpoint(tmp_path, {"epoch": 3}, commit_count=3)  # the next commit clears the leftover
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([CHECKPOINT_FILE, "halfway"])
    assert read_checkpoint(tmp_path)["state"] == {"epoch": 3}
