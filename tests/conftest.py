"""Shared test setup: the parallel suite runs only under ``torchring run`` (see integration tests)."""

import os

collect_ignore = [] if os.environ.get("TORCHRING_PARALLEL_SUITE") == "1" else ["parallel"]
