"""Exceptions raised by torchring, named as Horovod names them."""


class HorovodInternalError(RuntimeError):
    """A collective failed: a peer died, the job was shut down, or ranks disagreed on an operation.

    Elastic training treats it as a signal to roll back to the last commit.
    """


class TensorMismatchError(HorovodInternalError):
    """Ranks submitted the same named operation with different operation, dtype, shape or root."""


class HostsUpdatedInterrupt(RuntimeError):
    """The set of hosts changed; raised by elastic state at a commit point on every rank."""

    def __init__(self, skip_sync: bool = False) -> None:
        super().__init__("hosts were added or removed")
        self.skip_sync = skip_sync


NOT_INITIALIZED_MESSAGE = "Horovod has not been initialized; use hvd.init()."
