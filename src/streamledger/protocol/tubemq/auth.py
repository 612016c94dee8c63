"""TubeMQ client authentication: the signed AuthenticateInfo and the authorized-token round trip.

``signature = URLEncode(Base64(HMAC-SHA1(password, userName + timestamp + nonce)))`` (spec section
12). After a successful call the master may hand out an authorized token; later calls send the
token instead of the signature until the master answers ``requireAuth = true`` or rejects the
certificate (415). The password lives only in :class:`Credentials` and is never printed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
import threading
import time
import urllib.parse
from dataclasses import dataclass, field

from streamledger.protocol.tubemq._pb import tubemq_master_pb2 as master_pb

__all__ = ["AuthState", "Credentials", "sign"]


@dataclass(frozen=True)
class Credentials:
    """User name and password for a master with authentication enabled."""

    user: str
    password: str = field(repr=False)

    def __post_init__(self) -> None:
        if not self.user.strip():
            raise ValueError("TubeMQ user name must not be blank")


def sign(user: str, password: str, timestamp_ms: int, nonce: int) -> str:
    """The URL-encoded Base64 HMAC-SHA1 signature the master checks."""
    message = f"{user}{timestamp_ms}{nonce}".encode()
    digest = hmac.new(password.encode(), message, hashlib.sha1).digest()
    return urllib.parse.quote_plus(base64.b64encode(digest).decode("ascii"), safe="*-._")


class AuthState:
    """Decides per call whether to send full credentials, the authorized token, or nothing."""

    def __init__(self, credentials: Credentials | None) -> None:
        self._credentials = credentials
        self._token: str | None = None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._credentials is not None

    @property
    def has_token(self) -> bool:
        return self._token is not None

    def certificate(self, *, force_full: bool = False) -> master_pb.MasterCertificateInfo | None:
        """The MasterCertificateInfo to attach, or None when authentication is off."""
        creds = self._credentials
        if creds is None:
            return None
        with self._lock:
            token = self._token
        if token is not None and not force_full:
            return master_pb.MasterCertificateInfo(authorizedToken=token)
        timestamp = int(time.time() * 1000)
        nonce = secrets.randbelow(2**31)
        info = master_pb.AuthenticateInfo(
            userName=creds.user,
            timestamp=timestamp,
            nonce=nonce,
            othParams="",
            signature=sign(creds.user, creds.password, timestamp, nonce),
        )
        return master_pb.MasterCertificateInfo(authInfo=info)

    def update(self, authorized: master_pb.MasterAuthorizedInfo | None, require_auth: bool = False) -> None:
        """Remember a token the master issued; forget it when the master asks for full auth."""
        with self._lock:
            if require_auth:
                self._token = None
            elif authorized is not None and authorized.HasField("authAuthorizedToken"):
                self._token = authorized.authAuthorizedToken or None

    def reset(self) -> None:
        """Drop the token (after a 415 or a master switch)."""
        with self._lock:
            self._token = None
