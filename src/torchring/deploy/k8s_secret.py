"""The job secret of a Kubernetes job made by ``torchring k8s``: a ``Secret`` holding a fresh random
value, and the variables that hand it (and the job's id) to every pod's ranks.

Under ``torchring run`` the launcher makes each job's secret; in Kubernetes, torchrun starts the ranks
and nothing of torchring's runs before them, so the secret is made when the manifests are: each
``torchring k8s`` run generates a new one (``secrets.token_hex``), kept in a ``Secret`` and read by the
pods through ``valueFrom.secretKeyRef`` (never in the pod spec itself). The ranks read it as under
``torchring run`` (``store_auth.job_credentials``).
"""

from __future__ import annotations

import secrets
from typing import Any

from ..contract import JOB_ID, JOB_SECRET

__all__ = ["SECRET_KEY", "job_secret", "new_secret_value", "secret_env", "secret_name"]

#: The key of the secret's value in the ``Secret``'s data.
SECRET_KEY = "job-secret"


def new_secret_value() -> str:
    """A fresh 256-bit secret, hexadecimal (the form ``TORCHRING_JOB_SECRET`` takes)."""
    return secrets.token_hex(32)


def secret_name(job_name: str) -> str:
    """The ``Secret``'s name for job ``job_name``."""
    return f"{job_name}-torchring-secret"


def job_secret(job_name: str, labels: dict[str, str], value: str) -> dict[str, Any]:
    """The ``Secret`` object (type Opaque) holding the job's secret ``value``."""
    return {"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": secret_name(job_name), "labels": dict(labels)},
            "type": "Opaque", "stringData": {SECRET_KEY: value}}


def secret_env(job_name: str) -> list[dict[str, Any]]:
    """The container variables: the job's id (its name) and its secret, from the ``Secret``."""
    return [{"name": JOB_ID, "value": job_name},
            {"name": JOB_SECRET, "valueFrom": {"secretKeyRef": {"name": secret_name(job_name), "key": SECRET_KEY}}}]
