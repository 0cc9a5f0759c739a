"""Noise poisoning attacks on the first retrieval of each question (paper appendix 8.8.2, Table 5).

* **structural** attack: the first tool result of a question is *replaced* by noise (retrieval
  failed and returned junk);
* **partial** attack: noise is *appended* to the first tool result (the original is trimmed so
  that the noise still fits the observation token budget; otherwise the graph's own trimming
  would cut the noise away). If that first call failed, there is nothing to append to and the
  noise stands alone.

Noise kinds:

* ``irrelevant``: a sentence from a fixed bank of non-medical statements (:data:`IRRELEVANT_NOISE`,
  written for this package);
* ``relevant``: medical text about the same subject as the question but from *another* question
  (MedMCQA: same ``subject``; PubMedQA: the abstract with the most shared MeSH terms), so it is on
  topic without answering the question;
* ``mixed``: one irrelevant sentence followed by one relevant passage.

The paper hand-built 100 noise pieces per type from CMB-Exam; ours are constructed from the
evaluation data itself, deterministically from a seed and the question id.

Example:
    >>> from tcrag_langgraph.eval.datasets import QARecord
    >>> recs = [QARecord("1", "q1", "yesno", ("yes",), context="Aspirin inhibits COX.", metadata={"meshes": ["Aspirin"]}),
    ...         QARecord("2", "q2", "yesno", ("no",), context="Aspirin causes ulcers.", metadata={"meshes": ["Aspirin"]})]
    >>> bank = NoiseBank.from_records(recs)
    >>> bank.noise_for(recs[0], "relevant", seed=0)
    'Aspirin causes ulcers.'
"""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Sequence

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict

from ..tools.layer import is_tool_error
from ..tools.tokens import count_tokens, trim_to_tokens
from .datasets import QARecord

__all__ = [
    "AttackMode",
    "NoiseKind",
    "IRRELEVANT_NOISE",
    "NoiseBank",
    "PoisonController",
    "PoisonedTool",
    "poison_tools",
]

AttackMode = Literal["structural", "partial"]
NoiseKind = Literal["irrelevant", "relevant", "mixed"]

#: Off-topic statements used as irrelevant retrieval noise.
IRRELEVANT_NOISE: tuple[str, ...] = (
    "The Eiffel Tower was completed in 1889 and is about 330 metres tall including its antennas.",
    "A standard chess board has 64 squares arranged in an eight-by-eight grid.",
    "Sourdough bread is leavened by a culture of wild yeast and lactic acid bacteria.",
    "The Pacific Ocean covers more area than all of the Earth's land masses combined.",
    "In football, a hat-trick means one player scores three goals in a single match.",
    "The violin family includes the violin, the viola, the cello and the double bass.",
    "Mount Kilimanjaro in Tanzania is the highest free-standing mountain in the world.",
    "Compound interest is calculated on the principal plus the interest already earned.",
    "The Great Wall of China was built and rebuilt over many dynasties across two millennia.",
    "A haiku is a short poem of three lines with five, seven and five syllables.",
    "Jupiter is the largest planet of the solar system and has dozens of known moons.",
    "The first modern Olympic Games were held in Athens in 1896.",
    "Espresso is brewed by forcing hot water through finely ground coffee under pressure.",
    "Python lists are mutable sequences, whereas tuples cannot be changed after creation.",
    "The Amazon river carries more water to the sea than any other river on Earth.",
    "Bonsai is the art of growing miniature trees in containers through careful pruning.",
    "A marathon race covers a distance of 42.195 kilometres.",
    "The Mona Lisa was painted by Leonardo da Vinci in the early sixteenth century.",
    "Honey bees communicate the location of flowers to each other through a waggle dance.",
    "Basalt is a volcanic rock formed from the rapid cooling of lava rich in magnesium and iron.",
    "The stock exchange opening bell marks the start of the trading day.",
    "Penguins are flightless birds that live almost exclusively in the Southern Hemisphere.",
    "Origami is the Japanese art of folding paper into decorative shapes and figures.",
    "The speed of sound in dry air at 20 degrees Celsius is about 343 metres per second.",
    "Tea originated in China and was first drunk as a medicinal beverage before becoming popular.",
    "A sonnet is a poem of fourteen lines that follows a strict rhyme scheme.",
    "The Sahara is the largest hot desert in the world, spanning much of North Africa.",
    "Cricket matches can last up to five days in the test format of the game.",
    "Glass is made by melting sand, soda ash and limestone at very high temperatures.",
    "The Rosetta Stone helped scholars decipher Egyptian hieroglyphs in the nineteenth century.",
)


def _rng(seed: int, record_id: str, salt: str) -> random.Random:
    # A string seed is hashed with SHA-512 by random.seed: stable across processes.
    return random.Random(f"{seed}:{salt}:{record_id}")


def _passage(record: QARecord) -> str:
    if record.context:
        return record.context
    explanation = record.metadata.get("explanation")
    if explanation:
        return str(explanation)
    options = " ".join(f"{k}. {v}" for k, v in record.options.items())
    return f"{record.question} {options}".strip()


@dataclass
class NoiseBank:
    """Irrelevant sentences plus, per question id, candidate relevant passages."""

    irrelevant: Sequence[str] = IRRELEVANT_NOISE
    relevant: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def from_records(
        cls,
        records: Sequence[QARecord],
        *,
        pool: Optional[Sequence[QARecord]] = None,
        irrelevant: Sequence[str] = IRRELEVANT_NOISE,
        candidates: int = 5,
    ) -> "NoiseBank":
        """Relevant noise for each of ``records`` from the other questions of ``pool``
        (default: ``records`` itself): same MedMCQA subject, or most shared MeSH terms."""
        pool = list(pool if pool is not None else records)
        if len(pool) < 2:
            raise ValueError("relevant noise needs a pool of at least two questions")
        relevant: dict[str, list[str]] = {}
        for rec in records:
            others = [o for o in pool if o.id != rec.id]
            subject = rec.metadata.get("subject")
            meshes = set(rec.metadata.get("meshes") or [])
            if subject:
                same = [o for o in others if o.metadata.get("subject") == subject]
                ranked = same or others
            elif meshes:
                ranked = sorted(others, key=lambda o: -len(meshes & set(o.metadata.get("meshes") or [])))
                best = len(meshes & set(ranked[0].metadata.get("meshes") or []))
                ranked = [o for o in ranked if len(meshes & set(o.metadata.get("meshes") or [])) == best] if best else ranked
            else:
                ranked = others
            relevant[rec.id] = [_passage(o) for o in ranked[: max(candidates, 1)] if _passage(o)]
        if not irrelevant:
            raise ValueError("the irrelevant noise bank is empty")
        return cls(irrelevant=tuple(irrelevant), relevant=relevant)

    def noise_for(self, record: QARecord, kind: NoiseKind, *, seed: int = 0) -> str:
        """The noise text for ``record`` (deterministic in ``seed`` and the record id)."""
        if kind not in ("irrelevant", "relevant", "mixed"):
            raise ValueError(f"unknown noise kind {kind!r}")
        parts = []
        if kind in ("irrelevant", "mixed"):
            parts.append(_rng(seed, record.id, "irrelevant").choice(list(self.irrelevant)))
        if kind in ("relevant", "mixed"):
            options = self.relevant.get(record.id)
            if not options:
                raise KeyError(f"no relevant noise for question {record.id!r}; build the bank from its dataset")
            parts.append(_rng(seed, record.id, "relevant").choice(options))
        return "\n".join(parts)


class PoisonController:
    """Applies the attack to the first tool result of the current question (thread-safe).

    Call :meth:`begin` before each question (the runner does); ``poisoned`` then tells whether
    the attack actually happened (a method that never retrieves is never attacked).
    """

    def __init__(
        self, bank: NoiseBank, *, mode: AttackMode, kind: NoiseKind, seed: int = 0, max_tokens: int = 512
    ) -> None:
        if mode not in ("structural", "partial"):
            raise ValueError(f"unknown attack mode {mode!r}")
        if kind not in ("irrelevant", "relevant", "mixed"):
            raise ValueError(f"unknown noise kind {kind!r}")
        self.bank, self.mode, self.kind, self.seed, self.max_tokens = bank, mode, kind, seed, max_tokens
        self._lock = threading.Lock()
        self._record: Optional[QARecord] = None
        self.poisoned = False
        self.noise: Optional[str] = None
        self.first_call_failed: Optional[bool] = None

    def begin(self, record: QARecord) -> None:
        with self._lock:
            self._record = record
            self.poisoned = False
            self.noise = None
            self.first_call_failed = None

    def apply(self, result: Any) -> Any:
        """Poison ``result`` if it is the question's first retrieval; else return it unchanged."""
        with self._lock:
            if self._record is None:
                raise RuntimeError("PoisonController.begin(record) must be called before the question runs")
            if self.poisoned:
                return result
            self.poisoned = True
            noise = self.bank.noise_for(self._record, self.kind, seed=self.seed)
            self.noise = noise
            failed = is_tool_error(result)
            self.first_call_failed = failed
        if self.mode == "structural" or failed:
            return trim_to_tokens(noise, self.max_tokens)
        text = result if isinstance(result, str) else str(getattr(result, "content", result))
        room = self.max_tokens - count_tokens(noise) - 1
        kept = trim_to_tokens(text, room) if room > 0 else ""
        return f"{kept}\n{noise}" if kept else trim_to_tokens(noise, self.max_tokens)


class PoisonedTool(BaseTool):
    """Wraps a tool: same name, description and schema; the controller edits the first result.

    Callbacks fire once, from the wrapped tool, so retrievals are not double counted.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    inner: BaseTool
    controller: Any

    def invoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:  # noqa: A002
        return self.controller.apply(self.inner.invoke(input, config, **kwargs))

    async def ainvoke(self, input: Any, config: Optional[RunnableConfig] = None, **kwargs: Any) -> Any:  # noqa: A002
        return self.controller.apply(await self.inner.ainvoke(input, config, **kwargs))

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("run_manager", None)
        kwargs.pop("config", None)
        payload: Any = kwargs if kwargs else (args[0] if args else "")
        return self.invoke(payload)


def poison_tools(tools: Sequence[BaseTool], controller: PoisonController) -> list[BaseTool]:
    """The tools wrapped so that ``controller`` poisons each question's first retrieval."""
    return [
        PoisonedTool(
            name=t.name,
            description=t.description,
            args_schema=t.args_schema,
            metadata=t.metadata,  # e.g. the schema a grammar writes its input to (tools.base.WRITTEN_INPUT_SCHEMA)
            inner=t,
            controller=controller,
        )
        for t in tools
    ]
