"""Owner scoping of the Agent Server's other resources: assistants, crons and the store.

Registered on :data:`tcrag_langgraph.faces.auth.auth` (the object ``langgraph.json`` "auth" names) next
to its thread handler, so that under ``langgraph dev`` / ``langgraph up`` every resource belongs to
the user who made it. The user is always the one ``@auth.authenticate`` returned (a token checked
against the users file), never a value the client sent.

* **Assistants**: a new assistant is stamped ``metadata.owner = <identity>`` (a client's own
  ``owner`` or ``created_by`` metadata is overwritten or dropped). Reads and searches see the
  user's own assistants and the graph's system assistants (``created_by: system``, made by the
  server from ``langgraph.json``); update and delete reach the user's own assistants only, so
  nobody can patch or delete another user's assistant (or a system one) through the API.
* **Crons**: stamped with their owner on creation; every read, search, update and delete is
  filtered by it.
* **Store**: every item lives under a namespace whose first label is the user's own root,
  :func:`store_root` (``u-`` and 32 hex digits of the SHA-256 of the identity: identities may hold
  dots, which namespace labels may not). A namespace the client sends is put under that root
  unless it already starts with it (so a namespace read back from an item can be sent again);
  ``search`` and ``list_namespaces`` are confined to it. Two users writing ``("notes",)`` write two
  different items.

Any other resource or action (one a later server version adds) is refused: a global ``@auth.on``
handler denies what no handler above covers (the server would otherwise let it through).
"""

from __future__ import annotations

import hashlib
from typing import Any

from langgraph_sdk import Auth

__all__ = ["OWNER_KEY", "store_root", "scoped_namespace", "register_resource_handlers"]

#: The metadata key holding a resource's owner (the same one the thread handler uses).
OWNER_KEY = "owner"
_SYSTEM = {"created_by": "system"}


def store_root(identity: str) -> str:
    """The first namespace label of ``identity``'s store items.

    Example:
        >>> store_root("dr-lee")
        'u-0912a6aeb6186a3ca3901c90d6dbbca9'
    """
    return "u-" + hashlib.sha256(identity.encode("utf-8")).hexdigest()[:32]


def scoped_namespace(identity: str, namespace: Any) -> tuple[str, ...]:
    """``namespace`` under the user's root (unchanged if it already starts with it).

    Example:
        >>> scoped_namespace("dr-lee", ("notes",))[1:], scoped_namespace("dr-lee", None)[1:]
        (('notes',), ())
        >>> ns = scoped_namespace("dr-lee", ("notes",)); scoped_namespace("dr-lee", ns) == ns
        True
    """
    root = store_root(identity)
    labels = tuple(namespace or ())
    return labels if labels[:1] == (root,) else (root, *labels)


def _stamp_owner(ctx: Auth.types.AuthContext, value: Any) -> None:
    if not isinstance(value, dict):
        return
    metadata = value.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
        value["metadata"] = metadata
    metadata.pop("created_by", None)  # only the server's own assistants are "system"
    metadata[OWNER_KEY] = ctx.user.identity


def register_resource_handlers(auth: Auth) -> None:
    """Add the assistant, cron and store handlers described in the module docstring to ``auth``."""

    @auth.on.assistants.create
    async def assistant_create(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        _stamp_owner(ctx, value)
        return {OWNER_KEY: ctx.user.identity}

    @auth.on.assistants.read
    async def assistant_read(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return {"$or": [{OWNER_KEY: ctx.user.identity}, _SYSTEM]}

    @auth.on.assistants.search
    async def assistant_search(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return {"$or": [{OWNER_KEY: ctx.user.identity}, _SYSTEM]}

    @auth.on.assistants.update
    async def assistant_update(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        if isinstance(value, dict) and isinstance(value.get("metadata"), dict):
            _stamp_owner(ctx, value)  # an update can neither give an assistant away nor make it "system"
        return {OWNER_KEY: ctx.user.identity}

    @auth.on.assistants.delete
    async def assistant_delete(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return {OWNER_KEY: ctx.user.identity}

    @auth.on.crons.create
    async def cron_create(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        _stamp_owner(ctx, value)
        return {OWNER_KEY: ctx.user.identity}

    @auth.on.crons
    async def cron_owner_only(ctx: Auth.types.AuthContext, value: Any) -> Auth.types.FilterType:
        return {OWNER_KEY: ctx.user.identity}

    @auth.on
    async def deny_everything_else(ctx: Auth.types.AuthContext, value: Any) -> bool:
        """Default deny: a resource or action a future server adds is refused until it has a handler."""
        return False

    @auth.on.store
    async def store_per_user(ctx: Auth.types.AuthContext, value: Any) -> None:
        if isinstance(value, dict):
            value["namespace"] = scoped_namespace(ctx.user.identity, value.get("namespace"))
