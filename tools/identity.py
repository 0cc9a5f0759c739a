"""Who a tool call is made for: the caller identity that tools holding patient data check.

The identity lives with the tools so that any agent can use them without importing ours. An agent
hands it to a tool under ``config["configurable"][CALLER_KEY]``; the tool reads it back with
:func:`caller_from_config`. Where it comes from (trusted configuration or an authenticated server
user, never a client's own words) is the agent's or the server's business.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CALLER_KEY", "CallerContext", "caller_from_config"]

#: Key under ``config["configurable"]`` where the graph hands the caller identity to tools.
CALLER_KEY = "tcrag_caller"


class CallerContext(BaseModel):
    """Who is asking. Tools that hold patient data (EMR) only show what this caller may see.

    ``allowed_patient_ids=None`` means no patient records at all, never "everything".
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    user_id: str = Field(min_length=1)
    roles: tuple[str, ...] = ()
    allowed_patient_ids: Optional[tuple[str, ...]] = None

    def may_see(self, patient_id: str) -> bool:
        return self.allowed_patient_ids is not None and str(patient_id) in self.allowed_patient_ids


def caller_from_config(config: Mapping[str, Any] | None) -> Optional[CallerContext]:
    """The caller a tool was invoked for, from its RunnableConfig (None if anonymous)."""
    if not config:
        return None
    value = (config.get("configurable") or {}).get(CALLER_KEY)
    if value is None or isinstance(value, CallerContext):
        return value
    return CallerContext.model_validate(value)
