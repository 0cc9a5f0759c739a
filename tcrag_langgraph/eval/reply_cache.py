"""A greedy evaluation's replies kept in its run folder, so a prompt two methods send alike is
generated once (``tcrag eval --reply-cache``).

TC-RAG with any state value and its ablation without the monitor see the same prompts until the
first Conclusion is judged, and greedy decoding gives one reply to one prompt; without a cache
every variant pays for the same generations again. A hit returns the stored reply: the same text,
the same token counts.

What a hit changes, and how it is reported:

* **Time.** A hit takes milliseconds. The stored reply carries the seconds its generation took, and
  the meter adds them to the run's ``wall_time_s`` (``replayed_s`` says how much of it was replayed,
  ``cached_calls`` how many calls), so a method's time reads as if it had generated every reply.
* **Float noise.** A local backend that reuses a cached key/value prefix can round a near-tie the
  other way than a fresh prefill would; with the cache, two methods that send one prompt get one
  reply. This is the point for comparing a method with its ablation.

Only greedy runs may use it (the CLI refuses it with ``--temperature`` above 0): a sampled reply is
one draw, not *the* reply. The key is the prompt messages and the model's identifying parameters,
stop sequences and per-call options, as LangChain computes them.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Optional, Sequence

from langchain_core._api import LangChainBetaWarning
from langchain_core.caches import BaseCache
from langchain_core.load import dumps, loads
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, Generation

__all__ = ["ReplyCache", "REPLY_CACHE_FILE", "HIT_KEY", "SECONDS_KEY"]

#: The cache's file in a run folder.
REPLY_CACHE_FILE = "replies.sqlite"
#: ``response_metadata`` keys a replayed reply carries: that it was replayed, and what its generation took.
HIT_KEY = "reply_cache_hit"
SECONDS_KEY = "reply_cache_generation_s"
#: The only classes a stored reply may contain.
_STORED = [ChatGeneration, Generation, AIMessage]


class ReplyCache(BaseCache):
    """A LangChain cache in one SQLite file (parametrised statements only), thread-safe.

    Give it to a chat model as ``model.cache = ReplyCache(path)``. A miss starts a clock for its
    key; the ``update`` that follows for that key stores the seconds since then with the reply (on
    any thread or event loop), and a later hit hands them back in the reply's ``response_metadata``.
    """

    def __init__(self, path: "str | Path") -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._started: dict[tuple[str, str], float] = {}  # key of a miss -> when its generation began
        self._connection: Optional[sqlite3.Connection] = None

    @property
    def _db(self) -> sqlite3.Connection:
        """The file, opened on first use (a run refused before its first call leaves nothing behind).
        Call with the lock held."""
        if self._connection is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(str(self.path), check_same_thread=False)
            with self._connection:
                self._connection.execute(
                    "CREATE TABLE IF NOT EXISTS replies (prompt TEXT NOT NULL, llm TEXT NOT NULL, "
                    "generations TEXT NOT NULL, seconds REAL NOT NULL, PRIMARY KEY (prompt, llm))")
        return self._connection

    def lookup(self, prompt: str, llm_string: str) -> Optional[Sequence[Generation]]:
        with self._lock:
            row = self._db.execute("SELECT generations, seconds FROM replies WHERE prompt = ? AND llm = ?",
                                   (prompt, llm_string)).fetchone()
            if row is None:
                self._started[(prompt, llm_string)] = time.perf_counter()
                return None
        with warnings.catch_warnings():  # langchain_core marks loads as beta; it reads what its dumps wrote
            warnings.simplefilter("ignore", LangChainBetaWarning)
            generations = loads(row[0], allowed_objects=_STORED)  # nothing but what update() wrote
        for gen in generations:
            message = getattr(gen, "message", None)
            if message is not None:
                gen.message = message.model_copy(update={"response_metadata": {
                    **(message.response_metadata or {}), HIT_KEY: True, SECONDS_KEY: float(row[1])}})
        return generations

    def update(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        with self._lock:
            started = self._started.pop((prompt, llm_string), None)
        seconds = time.perf_counter() - started if started is not None else 0.0
        with self._lock, self._db as db:
            db.execute("INSERT OR REPLACE INTO replies (prompt, llm, generations, seconds) VALUES (?, ?, ?, ?)",
                       (prompt, llm_string, dumps(list(return_val)), seconds))

    # The same work on the caller's thread: sub-millisecond statements, and no executor hop between a
    # miss and its update.
    async def alookup(self, prompt: str, llm_string: str) -> Optional[Sequence[Generation]]:
        return self.lookup(prompt, llm_string)

    async def aupdate(self, prompt: str, llm_string: str, return_val: Sequence[Generation]) -> None:
        self.update(prompt, llm_string, return_val)

    def clear(self, **kwargs: Any) -> None:
        with self._lock, self._db as db:
            db.execute("DELETE FROM replies")

    def __len__(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM replies").fetchone()[0])
