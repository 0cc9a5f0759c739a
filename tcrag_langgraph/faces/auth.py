"""Authentication for the servers: the trusted users file, tokens, and LangGraph's Agent Server auth.

Who a run acts for is decided in one place, :func:`tcrag_langgraph.core.identity.caller_for_run`:
the authenticated server user, else (only with ``trust_client_identity``) a client caller, else the
build-time caller. This module supplies the first: LangGraph's Agent Server (``langgraph dev``)
writes the user returned by our ``@auth.authenticate`` handler (:data:`auth`, named in
``langgraph.json`` "auth") into ``config["configurable"]["langgraph_auth_user"]`` on every run, over
anything the client sent; ``tcrag serve`` writes its authenticated principal under the same key.

The trusted records come from a **users file** named by ``$TCRAG_AUTH_USERS`` (or
``tcrag serve --users-file``), JSON of the form::

    {"users": [{"identity": "dr-lee", "token_sha256": "<64 hex digits>",
                "roles": ["clinician"], "allowed_patient_ids": ["P00002"]}]}

Only the SHA-256 of each token is stored (:func:`hash_token`); a presented token (``Authorization:
Bearer <token>`` or ``X-API-Key: <token>``) is hashed and compared with every record using
:func:`hmac.compare_digest`. Without a users file every request is refused (fail closed).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from langgraph_sdk import Auth
from pydantic import BaseModel, ConfigDict, Field, ValidationError

# Absolute imports: langgraph dev loads this file by its path (langgraph.json "auth"), not as a package module.
from tcrag_langgraph.core.identity import _PATIENT, _ROLE, AUTH_USER_KEY

__all__ = [
    "AUTH_USER_KEY",
    "USERS_FILE_ENV",
    "UserRecord",
    "UserDirectory",
    "AuthenticatedUser",
    "hash_token",
    "token_from_headers",
    "auth",
]

log = logging.getLogger(__name__)

#: Environment variable naming the trusted users file.
USERS_FILE_ENV = "TCRAG_AUTH_USERS"

_HEX64 = re.compile(r"^[0-9a-f]{64}$")


def hash_token(token: str) -> str:
    """The SHA-256 hex digest stored in a users file for ``token``.

    Example:
        >>> hash_token("s3cret")[:16]
        '1ec1c26b50d5d3c5'
    """
    if not isinstance(token, str) or not token:
        raise ValueError("token must be a non-empty string")
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


class UserRecord(BaseModel):
    """One trusted user: who they are, the hash of their token, what they may see."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    identity: str = Field(min_length=1, max_length=200)
    token_sha256: str = Field(description="hash_token(token): 64 lower-case hex digits.")
    roles: tuple[str, ...] = ()
    allowed_patient_ids: Optional[tuple[str, ...]] = None

    def model_post_init(self, _: Any) -> None:
        if not _HEX64.match(self.token_sha256):
            raise ValueError(f"user {self.identity!r}: token_sha256 must be 64 lower-case hex digits")

    @property
    def permissions(self) -> list[str]:
        """The user's rights in LangGraph's ``permissions`` form (see the module docstring)."""
        return [_ROLE + r for r in self.roles] + [_PATIENT + p for p in (self.allowed_patient_ids or ())]

    def as_server_user(self) -> "AuthenticatedUser":
        return AuthenticatedUser(identity=self.identity, permissions=tuple(self.permissions))


@dataclass(frozen=True)
class AuthenticatedUser:
    """A user a server authenticated (LangGraph's ``BaseUser`` shape: ``identity``, ``permissions``)."""

    identity: str
    permissions: tuple[str, ...] = ()
    is_authenticated: bool = True

    @property
    def display_name(self) -> str:
        return self.identity


class UserDirectory:
    """The trusted users of a server, loaded from a users file.

    Example:
        >>> d = UserDirectory([UserRecord(identity="a", token_sha256=hash_token("tok-a"))])
        >>> d.authenticate("tok-a").identity, d.authenticate("wrong")
        ('a', None)
    """

    def __init__(self, users: Sequence[UserRecord]) -> None:
        users = list(users)
        if not users:
            raise ValueError("a users file needs at least one user")
        seen: set[str] = set()
        for user in users:
            if user.identity in seen or user.token_sha256 in {u.token_sha256 for u in users if u is not user}:
                raise ValueError(f"duplicate identity or token in users file: {user.identity!r}")
            seen.add(user.identity)
        self.users = tuple(users)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> "UserDirectory":
        """Load ``{"users": [...]}`` from ``path`` (a clear ValueError if it is missing or malformed)."""
        import json

        file = Path(path)
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ValueError(f"cannot read users file {file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise ValueError(f"users file {file} is not valid JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("users"), list):
            raise ValueError(f'users file {file} must be {{"users": [...]}}')
        try:
            return cls([UserRecord.model_validate(u) for u in data["users"]])
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"users file {file}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None

    def authenticate(self, token: Optional[str]) -> Optional[UserRecord]:
        """The user whose token this is, else None. Compares the token's hash with every record in
        constant time (no early exit, so timing does not tell which record came close)."""
        if not token:
            return None
        presented = hash_token(token)
        found: Optional[UserRecord] = None
        for user in self.users:
            if hmac.compare_digest(presented, user.token_sha256):
                found = user
        return found


def token_from_headers(headers: Mapping[str, str]) -> Optional[str]:
    """The token in ``Authorization: Bearer <token>`` or ``X-API-Key: <token>`` (header names in
    any case), else None."""
    lowered = {str(k).lower(): v for k, v in headers.items()}
    authorization = (lowered.get("authorization") or "").strip()
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    api_key = (lowered.get("x-api-key") or "").strip()
    return api_key or None


# ----- LangGraph Agent Server (langgraph dev / langgraph up): langgraph.json "auth" -----

_directory_lock = threading.Lock()
_directory_cache: dict[str, Any] = {}


def directory_from_env() -> UserDirectory:
    """The users file named by ``$TCRAG_AUTH_USERS`` (re-read when the file changes)."""
    path = os.environ.get(USERS_FILE_ENV)
    if not path:
        raise ValueError(f"no users file: set {USERS_FILE_ENV} to a JSON users file (see tcrag_langgraph.faces.auth)")
    stamp = (path, os.stat(path).st_mtime_ns) if os.path.exists(path) else (path, None)
    with _directory_lock:
        if _directory_cache.get("stamp") != stamp:
            _directory_cache["directory"] = UserDirectory.from_file(path)
            _directory_cache["stamp"] = stamp
        return _directory_cache["directory"]


#: The Agent Server's auth object (``langgraph.json``: ``"auth": {"path": "./tcrag_langgraph/faces/auth.py:auth"}``).
auth = Auth()


@auth.authenticate
async def authenticate(headers: dict) -> Auth.types.MinimalUserDict:
    """Authenticate every request against the users file; no or a wrong token is a 401."""
    text_headers = {(k.decode("latin-1") if isinstance(k, bytes) else k): (v.decode("latin-1") if isinstance(v, bytes) else v)
                    for k, v in headers.items()}
    try:
        directory = directory_from_env()
    except ValueError as exc:
        log.error("%s", exc)
        raise Auth.exceptions.HTTPException(status_code=401, detail="authentication is not configured") from None
    user = directory.authenticate(token_from_headers(text_headers))
    if user is None:
        raise Auth.exceptions.HTTPException(status_code=401, detail="missing or invalid token")
    return {"identity": user.identity, "permissions": user.permissions}


@auth.on.threads
async def owner_only(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
    """A thread (and the runs on it) belongs to the user who created it: a new thread or run is
    stamped with its owner, and every read, search, update or run on threads is filtered by it."""
    if isinstance(value, dict):
        metadata = value.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}
            value["metadata"] = metadata
        metadata["owner"] = ctx.user.identity
    return {"owner": ctx.user.identity}


# Assistants, crons and the store are owner-scoped too (tcrag_langgraph/faces/auth_resources.py).
from tcrag_langgraph.faces.auth_resources import register_resource_handlers  # noqa: E402

register_resource_handlers(auth)
