"""Authenticated values in the job's rendezvous store.

The store (a c10d ``TCPStore``) accepts any client that reaches its port, so every value torchring
writes there for another process is signed with the job's secret: ``HMAC-SHA256(secret, key, job id,
value)``, stored as the 32-byte tag followed by the value. A reader verifies the tag (in constant time)
before it parses anything; a value that fails is dropped with one warning naming its key, and is never
unpickled or parsed. The launcher makes a fresh secret per job (:meth:`JobCredentials.new`) and gives
it to each rank through the rank's environment (``contract.JOB_SECRET``), or through the JSON a remote
rank's supervisor reads on stdin; the rank takes it out of its environment the first time it needs it
(:func:`job_credentials`), so the processes it starts do not inherit it.

Without a secret (ranks started by torchrun, Slurm or MPI), values are still signed and checked, with
an empty key: that only catches corruption, it authenticates nothing, and :func:`require_credentials`
refuses what needs real authentication (unpickling a function). This module imports only the standard
library and ``contract``, so the launcher and the ranks both use it.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import threading
import uuid
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .contract import JOB_ID, JOB_SECRET

__all__ = ["DEFAULT_MAX_BYTES", "TAG_BYTES", "AuthenticatedStore", "JobCredentials", "RawStore",
           "adopt_credentials", "job_credentials", "read_credentials", "require_credentials", "sign", "verify"]

logger = logging.getLogger("torchring")

#: Length of the HMAC-SHA256 tag in front of every signed value.
TAG_BYTES = 32
#: The largest value :meth:`AuthenticatedStore.get` accepts unless told otherwise (1 MiB).
DEFAULT_MAX_BYTES = 1 << 20


class RawStore(Protocol):
    """What is used of a c10d ``Store``."""

    def set(self, key: str, value: Any) -> None: ...

    def get(self, key: str) -> bytes: ...

    def check(self, keys: list[str]) -> bool: ...


def _message(job: str, key: str, value: bytes) -> bytes:
    head = f"torchring-store-v1\0{len(key)}:{key}\0{len(job)}:{job}\0".encode()
    return head + value


def sign(secret: bytes, job: str, key: str, value: bytes) -> bytes:
    """``value`` as stored under ``key``: its HMAC-SHA256 tag (over key, job id and value), then itself."""
    return hmac.new(secret, _message(job, key, value), hashlib.sha256).digest() + value


def verify(secret: bytes, job: str, key: str, signed: bytes) -> bytes | None:
    """The value inside ``signed`` if its tag is right for ``key`` and ``job``, else None."""
    if len(signed) < TAG_BYTES:
        return None
    tag, value = signed[:TAG_BYTES], signed[TAG_BYTES:]
    expected = hmac.new(secret, _message(job, key, value), hashlib.sha256).digest()
    return value if hmac.compare_digest(tag, expected) else None


@dataclass(frozen=True)
class JobCredentials:
    """A job's id and secret (``secret`` empty: no secret, values are only checked for integrity)."""

    job_id: str
    secret: bytes

    @classmethod
    def new(cls) -> JobCredentials:
        """Fresh credentials for a new job: a random id and a 256-bit random secret."""
        return cls(uuid.uuid4().hex[:10], secrets.token_bytes(32))

    @property
    def authenticated(self) -> bool:
        """Whether there is a secret, i.e. whether a verified value is known to come from the job."""
        return bool(self.secret)

    def environment(self) -> dict[str, str]:
        """The variables that hand these credentials to a rank."""
        return {JOB_ID: self.job_id, JOB_SECRET: self.secret.hex()}


_credentials: JobCredentials | None = None
_credentials_lock = threading.Lock()


def read_credentials(environ: MutableMapping[str, str]) -> JobCredentials:
    """The credentials in ``environ``, taking the secret out of it (so processes started with it
    afterwards do not inherit the secret)."""
    raw = environ.pop(JOB_SECRET, "")
    try:
        secret = bytes.fromhex(raw)
    except ValueError:
        raise ValueError(f"{JOB_SECRET} must be hexadecimal (torchring run sets it)") from None
    return JobCredentials(environ.get(JOB_ID, ""), secret)


def job_credentials() -> JobCredentials:
    """This process's credentials, read from ``os.environ`` at the first call (which removes the secret
    from it); later calls return the same."""
    global _credentials
    with _credentials_lock:
        if _credentials is None:
            _credentials = read_credentials(os.environ)
        return _credentials


def adopt_credentials(credentials: JobCredentials) -> None:
    """Use ``credentials`` as this process's, unless it was given a secret already (by a launcher):
    ranks that a scheduler started agree on a fresh secret among themselves (``environments.mpi``)."""
    global _credentials
    with _credentials_lock:
        current = _credentials if _credentials is not None else read_credentials(os.environ)
        _credentials = current if current.authenticated else credentials


def require_credentials(what: str) -> JobCredentials:
    """This process's credentials; an error naming ``what`` when the job has no secret."""
    credentials = job_credentials()
    if not credentials.authenticated:
        raise RuntimeError(f"{what} needs the job's secret ({JOB_SECRET}), which torchring run sets; this process "
                           "was not started by torchring run, so nothing it reads from the store is trusted")
    return credentials


class AuthenticatedStore:
    """Signed ``set`` and verified ``get`` over a c10d store; ``raw`` is the store itself (for c10d's own
    use: process groups, barriers).

    ``get`` returns None for a missing key and for a value that is too big or fails verification; the
    latter are warned about once per key and remembered in ``rejected``."""

    def __init__(self, raw: RawStore, credentials: JobCredentials, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.raw = raw
        self.credentials = credentials
        self.max_bytes = max_bytes
        #: Keys whose value was refused (too big or not signed with the job's secret).
        self.rejected: set[str] = set()
        self._lock = threading.Lock()

    def set(self, key: str, value: bytes | str) -> None:
        """Store ``value`` under ``key``, signed."""
        self.raw.set(key, self._signed(key, value))

    def set_many(self, keys: Sequence[str], values: Sequence[bytes | str]) -> None:
        """Store each of ``values`` under its key, signed, in one request where the store has ``multi_set``."""
        signed = [self._signed(key, value) for key, value in zip(keys, values, strict=True)]
        multi_set = getattr(self.raw, "multi_set", None)
        if multi_set is not None:
            multi_set(list(keys), signed)
            return
        for key, value in zip(keys, signed, strict=True):
            self.raw.set(key, value)

    def _signed(self, key: str, value: bytes | str) -> bytes:
        data = value.encode() if isinstance(value, str) else bytes(value)
        return sign(self.credentials.secret, self.credentials.job_id, key, data)

    def check(self, keys: Sequence[str]) -> bool:
        """Whether all ``keys`` exist (their values are not verified)."""
        return self.raw.check(list(keys))

    def get(self, key: str, max_bytes: int | None = None) -> bytes | None:
        """The verified value under ``key`` (at most ``max_bytes``, default ``self.max_bytes``; 0 for no
        limit), or None when it is missing, too big or not signed with the job's secret."""
        if not self.raw.check([key]):
            return None
        return self.verified(key, self.raw.get(key), max_bytes)

    def verified(self, key: str, signed: bytes, max_bytes: int | None = None) -> bytes | None:
        """The value inside ``signed`` (read from ``key``), or None after one warning."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        if limit and len(signed) > limit + TAG_BYTES:
            self.reject(key, f"its {len(signed)} bytes exceed the {limit}-byte limit")
            return None
        value = verify(self.credentials.secret, self.credentials.job_id, key, signed)
        if value is None:
            self.reject(key, "it is not signed with the job's secret (another process wrote it)")
        return value

    def reject(self, key: str, why: str) -> None:
        """Refuse the value of ``key`` (warned about once per key)."""
        with self._lock:
            first = key not in self.rejected
            self.rejected.add(key)
        if first:
            logger.warning("torchring: ignoring the value of %r in the rendezvous store: %s", key, why)
