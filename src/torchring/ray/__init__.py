"""torchring on a Ray cluster: ``RayExecutor`` and ``ElasticRayExecutor``, with the API of ``horovod.ray``'s.

Needs Ray (``pip install 'torchring[ray]'``); importing this package does not import Ray until used.
"""

from .elastic import ElasticRayExecutor, ElasticRaySettings, RayHostDiscovery
from .executor import RayExecutor, RaySettings

__all__ = ["ElasticRayExecutor", "ElasticRaySettings", "RayExecutor", "RayHostDiscovery", "RaySettings"]
