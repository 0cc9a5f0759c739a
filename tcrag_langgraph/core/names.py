"""Names a model misspells: the one fuzzy match every method uses for tool and function names."""

from __future__ import annotations

from typing import Optional, Sequence

from rapidfuzz import fuzz, process

__all__ = ["nearest_name"]


def nearest_name(word: str, names: Sequence[str], *, cutoff: float = 0.75) -> Optional[str]:
    """The name in ``names`` nearest to a near-miss ``word`` (a model's misspelt tool or function
    name), if its similarity (rapidfuzz's normalised Indel ratio) is at least ``cutoff``; else None.

    Example:
        >>> nearest_name("docrg", ["docrag", "kgrag", "websearch"])
        'docrag'
        >>> nearest_name("weather", ["docrag", "kgrag"]) is None
        True
    """
    found = process.extractOne(word, list(names), scorer=fuzz.ratio, score_cutoff=cutoff * 100)
    return found[0] if found else None
