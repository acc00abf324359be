"""``horovod.torch.elastic``: torchring's elastic training API."""

from torchring.elastic import *  # noqa: F401,F403
from torchring.elastic import __all__  # noqa: F401
