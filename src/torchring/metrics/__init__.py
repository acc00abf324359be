"""Prometheus metrics: what each rank counts (``counters``) and how it is served (``exporter``).

``torchring run --metrics-port PORT`` serves every rank's metrics and job-wide totals on the
launcher's host; a job started by another launcher sets ``TORCHRING_METRICS_PORT`` and each rank
serves its own on ``PORT + local rank``. ``record_samples(n)`` counts training samples for the
samples/s figures (``torchring.progress(..., batch_size=...)`` does it for you).
"""

from .counters import METRICS, record_samples

__all__ = ["METRICS", "record_samples"]
