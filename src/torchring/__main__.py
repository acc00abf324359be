"""``python -m torchring``: the same as the ``torchring`` command."""

import sys

from .cli import main

sys.exit(main())
