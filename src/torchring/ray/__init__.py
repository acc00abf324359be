"""torchring on a Ray cluster: ``RayExecutor``, with the API of ``horovod.ray.RayExecutor``.

Needs Ray (``pip install 'torchring[ray]'``); importing this package does not import Ray until used.
"""

from .executor import RayExecutor, RaySettings

__all__ = ["RayExecutor", "RaySettings"]
