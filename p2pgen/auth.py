"""Job secret handling and challenge-response proofs (invariant I8: Admission).

Owns: loading the job secret, deriving per-purpose keys from it, and the HMAC proofs used by every
handshake in p2pgen (agent control RPC, data-plane transport, state transfer). The secret itself
never crosses the wire: each side proves knowledge of it by an HMAC over fresh nonces.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets

log = logging.getLogger(__name__)

NONCE_BYTES = 16
SECRET_ENV = "P2PGEN_SECRET_FILE"


class SecretError(ValueError):
    """The job secret could not be loaded (missing, unreadable or empty file)."""


def load_secret(path: str | None, job: str) -> bytes:
    """Read the job secret from `path` (or the file named by $P2PGEN_SECRET_FILE).

    With neither, fall back to `insecure_default_secret(job)` and log a warning: convenient for a
    local demo, never for a real job.
    """
    secret = read_secret_file(path)
    if secret is None:
        log.warning("no --secret-file given: job %r uses an insecure default secret; "
                    "any process that knows the job name can join", job)
        return insecure_default_secret(job)
    return secret


def read_secret_file(path: str | None) -> bytes | None:
    """The secret in `path` (or $P2PGEN_SECRET_FILE); None when neither names a file."""
    path = path or os.environ.get(SECRET_ENV)
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            data = f.read().strip()
    except OSError as e:
        raise SecretError(f"cannot read secret file {path!r}: {e.strerror}") from e
    if not data:
        raise SecretError(f"secret file {path!r} is empty: put at least 16 random bytes in it")
    return data


def insecure_default_secret(job: str) -> bytes:
    """The secret of a job started without --secret-file (demo only: derivable from the job name)."""
    return hashlib.sha256(b"p2pgen-insecure-default:" + job.encode()).digest()


def derive_key(secret: bytes, job: str, purpose: str) -> bytes:
    """A key for one purpose ("raft", "control", "data", "state") of one job."""
    return hmac.new(secret, f"p2pgen/{job}/{purpose}".encode(), hashlib.sha256).digest()


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _framed(parts: tuple[bytes, ...]) -> bytes:
    return b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def prove(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over the length-prefixed parts (so part boundaries cannot be shifted)."""
    return hmac.digest(key, _framed(parts), "sha256")


def verify(key: bytes, proof: bytes, *parts: bytes) -> bool:
    return hmac.compare_digest(prove(key, *parts), proof)


class Prover:
    """`prove` and `verify` under one key, keyed once: each proof copies the keyed HMAC state instead of setting up
    the key again (a quarter of the cost; the heartbeats prove and check hundreds of packets a second)."""

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def prove(self, *parts: bytes) -> bytes:
        """The same proof as `prove(key, *parts)` (each part's length and bytes fed in turn: no joined copy)."""
        mac = self._keyed.copy()
        for part in parts:
            mac.update(len(part).to_bytes(4, "big"))
            mac.update(part)
        return mac.digest()

    def verify(self, proof: bytes, *parts: bytes) -> bool:
        return hmac.compare_digest(self.prove(*parts), proof)
