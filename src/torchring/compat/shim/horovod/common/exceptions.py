"""``horovod.common.exceptions``: the exceptions elastic scripts catch."""

from torchring.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
