"""DRAGIN (Su et al. 2024, "Dynamic Retrieval Augmented Generation based on the Real-time Information
Needs of LLMs"; paper Table 1), without its attention part.

DRAGIN decides *when* to retrieve with RIND, a score per generated token: the entropy of the
next-token distribution it was drawn from, times the largest attention any later token pays it,
times 0 for a stopword (1 otherwise); and *what* to retrieve with QFS, the context tokens the
triggering token attends to most. Here the continuation (``lookahead_tokens`` new tokens) is written
without retrieved evidence and read sentence by sentence; the first sentence holding a content token
(not a stopword, not punctuation, not the ``Answer:`` label) whose entropy exceeds
``entropy_threshold`` triggers a retrieval:
the sentences before it are kept, the rest thrown away, and the answer goes on from there with the
evidence (as DRAGIN's own code truncates at the sentence that holds the token).

**Attention is absent**: the generator runs on llama.cpp, which returns logits but no attention
weights, and a served model returns neither. So RIND here is entropy x stopword indicator (the
attention factor taken as 1), and QFS is replaced by the content words of the question and of the
triggering sentence up to and including the triggering token (duplicates dropped, at most
``max_query_words``). A transformers generator could return attention (``output_attentions`` with
eager attention); that variant is not implemented.

Entropies come from the scorer over the generator's own weights (``token_stats``: one
teacher-forced pass, the entropy of the full next-token distribution at each token, in float64).
``entropy_threshold`` 2.5 nats (about 12 equally likely next tokens) is a prior choice, not tuned on
any split. Loop, budgets (``max_steps`` caps the retrieval rounds) and answer rule: :mod:`.adaptive`.

Example:
    >>> from tcrag_langgraph.testing import ScriptedTokenScorer, recording_model, scripted_tool
    >>> scorer = ScriptedTokenScorer(entropies={"dose": 4.0, "the": 9.0})   # "the" is a stopword
    >>> g = DRAGIN.build(model=recording_model(["It is the drug. The dose is 2 g.", "A dose of 1 g.",
    ...                                               "Answer: yes"]),
    ...                        tools=[scripted_tool("DOC_RAG", "passage about {input}")], scorer=scorer)
    >>> out = g.invoke({"question": "Is metformin first-line?"})
    >>> [e["query"] for e in out["evidence"]], out["draft"].splitlines()[0]
    (['metformin first-line dose'], 'It is the drug. A dose of 1 g.')
"""

from __future__ import annotations

from typing import Any, Optional

from pydantic import Field

from ..core import answer_format
from ..tools.text_analysis import STOPWORDS
from .adaptive import (
    ActiveRetrievalKernel,
    ActiveRetrievalOptions,
    Trigger,
    content_words,
    join_text,
    scoring_context,
    split_sentences,
)

__all__ = ["DRAGINOptions", "DRAGIN", "is_content_token"]


class DRAGINOptions(ActiveRetrievalOptions):
    """DRAGIN's trigger threshold and query length."""

    entropy_threshold: float = Field(default=2.5, gt=0.0, le=20.0,
                                     description="A content token whose next-token entropy (nats) is above this "
                                                 "triggers a retrieval.")
    max_query_words: int = Field(default=24, ge=1, le=128, description="Words of a query at most.")


def is_content_token(piece: str) -> bool:
    """A token that RIND counts: it holds a letter or digit, is not a stopword and not a lone letter
    (the stopword list leaves out single characters such as "a").

    Example:
        >>> [is_content_token(p) for p in (" the", " dose", ".", " 2", " a")]
        [False, True, False, True, False]
    """
    word = piece.strip().lower()
    lone_letter = len(word) == 1 and word.isalpha()
    return any(c.isalnum() for c in word) and word not in STOPWORDS and not lone_letter


class DRAGIN(ActiveRetrievalKernel):
    options_type = DRAGINOptions
    method = "DRAGIN"
    default_name = "dragin"
    reads_scores = True
    scorer_advice = "DRAGIN decides when to retrieve from token probabilities."

    def piece_of(self, reply: str, opts: Any) -> str:
        # the whole continuation, read sentence by sentence, up to its Answer line (the answer ends it)
        piece = ""
        for sentence in split_sentences(reply):
            piece = join_text(piece, sentence)
            if answer_format.ANSWER_LABEL.match("\n" + sentence):
                break
        return piece

    def check(self, work: dict[str, Any], question: str, draft: str, piece: str, opts: Any) -> Optional[Trigger]:
        kept = ""
        for sentence in split_sentences(piece):
            context = scoring_context(question, join_text(draft, kept))
            stats = self.token_stats(context, sentence)
            label = answer_format.ANSWER_LABEL.match(sentence)  # the "Answer:" label is format, not content
            label_end, offset = (label.end() if label else 0), 0
            for index, token in enumerate(stats):
                offset += len(token.piece)
                if offset <= label_end:
                    continue
                if is_content_token(token.piece) and token.entropy > opts.entropy_threshold:
                    upto = "".join(t.piece for t in stats[: index + 1])
                    words = list(dict.fromkeys(w.lower() for w in content_words(question) + content_words(upto)))
                    return Trigger(keep=kept, query=" ".join(words[: opts.max_query_words]),
                                   reason=f"entropy {token.entropy:.2f} of {token.piece.strip()!r} > "
                                          f"{opts.entropy_threshold}")
            kept = join_text(kept, sentence)
        return None
