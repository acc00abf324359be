"""Each rank submits a tensor no other rank submits: with a stall shutdown time, all must fail clearly."""

import torch

import torchring as hvd

hvd.init()
try:
    hvd.allreduce(torch.ones(1), name=f"only.rank{hvd.rank()}")
    print("NO ERROR")
except RuntimeError as error:
    print(f"stall error: {str(error).splitlines()[0]}")
