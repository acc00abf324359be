"""Horovod's package name, served by torchring (see ``torchring run --horovod-compat``)."""

from torchring.version import __version__ as _torchring_version

#: The Horovod release whose behaviour torchring follows, tagged with torchring's own version.
__version__ = f"0.28.1+torchring.{_torchring_version}"

from torchring import run  # noqa: E402,F401 - horovod.run(fn, ...): the function on every rank
