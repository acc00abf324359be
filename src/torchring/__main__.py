"""``python -m torchring``: the same as the ``torchring`` command."""

from .cli import console

console()
