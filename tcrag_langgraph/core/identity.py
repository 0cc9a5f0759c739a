"""Who a run acts for: the authenticated server user, else (only when the graph was built to trust it)
the client's caller, else the build-time caller of the trusted configuration.

Every method's tool calls go through :func:`caller_for_run` (in :class:`~.kernel.RunKernel`), so
patient data (EMR_SEARCH) reaches only the caller a trusted source names. ``context`` and
``configurable`` are written by the client and are never an identity by themselves: the server user
must be an object with an ``identity`` attribute (LangGraph's ``BaseUser`` protocol); a plain mapping
under ``langgraph_auth_user`` (all that JSON can carry) is refused, and the run then acts for nobody.
The servers that authenticate users are faces (:mod:`tcrag_langgraph.faces.auth`).

Mapping of a server user to a :class:`~tcrag_langgraph.tools.identity.CallerContext`:

* ``identity`` -> ``user_id``;
* each permission ``"patient:<ID>"`` -> ``<ID>`` in ``allowed_patient_ids`` (none -> ``None``, which
  means no patient records, never "all");
* each permission ``"role:<NAME>"`` -> ``<NAME>`` in ``roles``; other permissions are ignored.

Example:
    >>> from tcrag_langgraph.tools.identity import CallerContext
    >>> class User:  # what the server puts in the run config
    ...     identity = "dr-lee"
    ...     permissions = ["role:clinician", "patient:P00002"]
    >>> caller_for_run({"configurable": {"langgraph_auth_user": User()}}, base=None)
    CallerContext(user_id='dr-lee', roles=('clinician',), allowed_patient_ids=('P00002',))
    >>> forged = {"configurable": {"langgraph_auth_user": {"identity": "x", "permissions": ["patient:P00002"]}}}
    >>> caller_for_run(forged, base=CallerContext(user_id="svc")) is None
    True
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from langchain_core.runnables import RunnableConfig

from ..tools.identity import CallerContext

__all__ = ["AUTH_USER_KEY", "caller_for_run", "caller_from_auth_user"]

log = logging.getLogger(__name__)

#: Where LangGraph's Agent Server (and ``tcrag serve``) put the authenticated user in a run config.
AUTH_USER_KEY = "langgraph_auth_user"
_PATIENT = "patient:"
_ROLE = "role:"


def caller_from_auth_user(user: Any) -> Optional[CallerContext]:
    """Map a server-authenticated user to a caller (see the module docstring); None if ``user`` is
    not a server user object (a plain mapping is what a client could have sent)."""
    if user is None or isinstance(user, Mapping) or not hasattr(user, "identity"):
        return None
    try:
        identity = user.identity
        permissions = getattr(user, "permissions", None) or ()
    except (AttributeError, NotImplementedError, KeyError):
        return None
    if not isinstance(identity, str) or not identity:
        return None
    permissions = [p for p in permissions if isinstance(p, str)]
    patients = tuple(p[len(_PATIENT):] for p in permissions if p.startswith(_PATIENT) and len(p) > len(_PATIENT))
    roles = tuple(p[len(_ROLE):] for p in permissions if p.startswith(_ROLE) and len(p) > len(_ROLE))
    return CallerContext(user_id=identity, roles=roles, allowed_patient_ids=patients or None)


def caller_for_run(
    config: RunnableConfig | Mapping[str, Any] | None,
    *,
    base: Optional[CallerContext],
    trust_client_identity: bool = False,
    client_caller: Optional[CallerContext] = None,
) -> Optional[CallerContext]:
    """The caller a run acts for: the authenticated server user, else (only with
    ``trust_client_identity``) ``client_caller``, else the build-time ``base``.

    A ``langgraph_auth_user`` that is not a server user object (e.g. a dict a client put in
    ``configurable`` or ``context``) gives no access at all: the run acts for nobody.
    """
    configurable = (config or {}).get("configurable") or {}
    if AUTH_USER_KEY in configurable and configurable[AUTH_USER_KEY] is not None:
        caller = caller_from_auth_user(configurable[AUTH_USER_KEY])
        if caller is None:
            log.warning("refusing a %s that is not a server-authenticated user", AUTH_USER_KEY)
        return caller
    if trust_client_identity and client_caller is not None:
        return client_caller
    return base
