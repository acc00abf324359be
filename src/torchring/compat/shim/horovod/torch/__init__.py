"""``horovod.torch``: every public name of torchring."""

from torchring import *  # noqa: F401,F403
from torchring import __all__  # noqa: F401
