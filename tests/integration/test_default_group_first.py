"""A script that initialises torch.distributed's default group itself before ``hvd.init()`` (as Ray Train's
``TorchTrainer``, Lightning and Accelerate do, with ``MASTER_ADDR``/``MASTER_PORT`` and no torchrun
agent): rank 0's default group already listens on the rendezvous port, and torchring joins that store
instead of failing to listen on it; both the default group and torchring's collectives then work."""

import os
import subprocess
import sys
from pathlib import Path

from ..ports import free_port

SCRIPT = Path(__file__).resolve().parent / "scripts" / "default_group_first.py"
_GIVEN = ("TORCHRING_STORE_ADDR", "TORCHRING_STORE_PORT", "TORCHRING_JOB_SECRET", "TORCHRING_RANK", "HOROVOD_RANK")


def test_hvd_init_after_init_process_group_shares_the_default_groups_store():
    port = free_port()
    base = {name: value for name, value in os.environ.items() if name not in _GIVEN}
    processes = []
    for rank in range(2):
        env = {**base, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        processes.append(subprocess.Popen([sys.executable, str(SCRIPT)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    outputs = []
    for process in processes:
        try:
            out, err = process.communicate(timeout=120)
        finally:
            if process.poll() is None:
                process.kill()
        outputs.append((process.returncode, out, err))
    for rank, (code, out, err) in enumerate(outputs):
        assert code == 0, f"rank {rank}:\n{out}\n{err[-3000:]}"
        assert f"rank {rank} size 2 torchring-sum 1 default-group-sum 2 reinit-sum 1" in out, out + err[-2000:]
