"""API keys come from the environment, named by the user (``--api-key-env NAME``), never from a
command line, where every user of the machine can read them (``ps``) and shells keep them.

Example:
    >>> import os
    >>> os.environ["TCRAG_DOCTEST_KEY"] = "sk-doctest"
    >>> key_from_env("TCRAG_DOCTEST_KEY")
    'sk-doctest'
    >>> key_from_env(None) is None
    True
"""

from __future__ import annotations

import os
import re
from typing import Optional

__all__ = ["key_from_env", "MissingCredentialsError"]

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class MissingCredentialsError(ValueError):
    """The named environment variable holds no key."""


def key_from_env(name: Optional[str], *, flag: str = "--api-key-env") -> Optional[str]:
    """The key held by environment variable ``name`` (None without a name). A value that is not a
    variable name (a key pasted in its place, say) is a ValueError; an unset or empty variable a
    :class:`MissingCredentialsError`. Neither message repeats what was given."""
    if name is None:
        return None
    if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
        raise ValueError(f"{flag} takes the NAME of an environment variable holding the key "
                         "(e.g. OPENAI_API_KEY), never the key itself")
    value = os.environ.get(name, "").strip()
    if not value:
        raise MissingCredentialsError(f"the environment variable {name} (named by {flag}) is not set")
    return value
