"""What the state monitor's rejections changed (issue 23 item 3).

TC-RAG keeps a Conclusion whose state value is not below sigma as a Thought and goes on; the run may
then conclude something else. For the rows of a ``tcrag eval`` run (each keeps the Conclusions the
monitor rejected, ``rejected``) this counts, among the questions with at least one rejection, how
often the final answer differs from the first rejected one (both read as the task's label, yes/no/
maybe or option letters), and how often that change went from wrong to right or from right to wrong;
and what the runs with a rejection cost against those without (total tokens and model calls per
question: on PubMedQA-L test the 1.5B's runs with a rejection were a third of the questions and 63 %
of TC-RAG's tokens, docs/evaluation.md).

Example:
    >>> from tcrag_langgraph.eval.datasets import QARecord
    >>> recs = [QARecord("1", "q", "yesno", ("yes",)), QARecord("2", "q", "yesno", ("no",))]
    >>> rows = [{"id": "1", "method": "tcrag-cppl", "rejected": ["no"], "parsed": "yes", "correct": True},
    ...         {"id": "2", "method": "tcrag-cppl", "rejected": ["no"], "parsed": "yes", "correct": False}]
    >>> e = rejection_effects(rows, recs)["tcrag-cppl"]
    >>> (e.rejected, e.changed, e.wrong_to_right, e.right_to_wrong)
    (2, 2, 1, 1)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from .datasets import QARecord

__all__ = ["RejectionEffect", "rejection_effects", "rejections_markdown"]


@dataclass
class RejectionEffect:
    """Counts over one method's questions."""

    questions: int = 0
    #: questions where the monitor rejected at least one Conclusion
    rejected: int = 0
    #: ... and the final answer's label differs from the first rejected Conclusion's
    changed: int = 0
    wrong_to_right: int = 0
    right_to_wrong: int = 0
    #: the final answer is right (among the questions with a rejection)
    right_after_rejection: int = 0
    #: the first rejected Conclusion was right (it would have been the answer without the monitor)
    rejected_was_right: int = 0
    #: total tokens and model calls summed over the questions with a rejection, and over those without
    tokens_with: int = 0
    calls_with: int = 0
    tokens_without: int = 0
    calls_without: int = 0

    def per_question(self, with_rejection: bool) -> tuple[float, float]:
        """(total tokens, model calls) per question among those with a rejection, or those without."""
        n = self.rejected if with_rejection else self.questions - self.rejected
        if n == 0:
            return (0.0, 0.0)
        tokens, calls = (self.tokens_with, self.calls_with) if with_rejection else (self.tokens_without, self.calls_without)
        return (tokens / n, calls / n)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def rejection_effects(rows: Iterable[Mapping[str, Any]], records: Sequence[QARecord]) -> dict[str, RejectionEffect]:
    """:class:`RejectionEffect` per method, for yes/no and multiple-choice questions."""
    from .runner import score_answer

    by_id = {r.id: r for r in records}
    out: dict[str, RejectionEffect] = {}
    for row in rows:
        record = by_id.get(row.get("id"))
        if record is None or record.task == "open":
            continue
        effect = out.setdefault(row["method"], RejectionEffect())
        effect.questions += 1
        rejected = row.get("rejected") or []
        tokens, calls = int(row.get("total_tokens") or 0), int(row.get("llm_calls") or 0)
        if not rejected:
            effect.tokens_without += tokens
            effect.calls_without += calls
            continue
        effect.rejected += 1
        effect.tokens_with += tokens
        effect.calls_with += calls
        first = score_answer(record, rejected[0])
        final_right = bool(row.get("correct"))
        effect.right_after_rejection += final_right
        effect.rejected_was_right += bool(first["correct"])
        if first["parsed"] != row.get("parsed"):
            effect.changed += 1
            effect.wrong_to_right += (not first["correct"]) and final_right
            effect.right_to_wrong += bool(first["correct"]) and not final_right
    return out


def rejections_markdown(effects: Mapping[str, RejectionEffect], labels: Optional[Mapping[str, str]] = None) -> str:
    """The methods whose monitor rejected something, as a Markdown table ("" when none did)."""
    shown = {m: e for m, e in effects.items() if e.rejected}
    if not shown:
        return ""
    lines = ["| Method | Questions | With a rejection | Answer changed | Wrong to right | Right to wrong "
             "| Right after a rejection | First rejected was right | Tokens / q with / without a rejection "
             "| Calls / q with / without |", "|" + "---|" * 10]
    for method, e in shown.items():
        (tw, cw), (to, co) = e.per_question(True), e.per_question(False)
        lines.append(f"| {(labels or {}).get(method, method)} | {e.questions} | {e.rejected} | {e.changed} "
                     f"| {e.wrong_to_right} | {e.right_to_wrong} | {e.right_after_rejection} | {e.rejected_was_right} "
                     f"| {tw:,.0f} / {to:,.0f} | {cw:.2f} / {co:.2f} |")
    return "\n".join(lines) + "\n"
