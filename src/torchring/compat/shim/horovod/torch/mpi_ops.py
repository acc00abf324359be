"""``horovod.torch.mpi_ops``: the collectives, handles, reduction ops and process sets, where some
scripts import them from."""

from torchring import *  # noqa: F401,F403
from torchring import __all__  # noqa: F401
