"""Prints the launcher variables each rank sees."""

import os

names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
         "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_CROSS_RANK",
         "HOROVOD_CROSS_SIZE", "TORCHRING_RANK", "TORCHRING_SIZE", "OMP_NUM_THREADS"]
for name in names:
    print(f"{name}={os.environ.get(name)}")
print("partial line without newline", end="")
