"""GBNF grammars on llama.cpp: checked once per grammar text before llama.cpp samples with it, and
whether a grammar admits a given text, decided by llama.cpp's own grammar engine.

Why the check: llama-cpp-python hands a grammar to ``llama_sampler_init_grammar`` inside ``generate``
and adds the result to the sampler chain without looking at it; a grammar llama.cpp cannot parse
gives a NULL sampler there, and the next sample crashes the process. So every grammar is compiled
here first (a :class:`GrammarError` naming it when llama.cpp refuses it) and the checked
``LlamaGrammar`` is kept per model and text.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .llama_cpp_native import import_llama_cpp, quiet_native

__all__ = ["GrammarError", "GreedyGrammar", "checked_grammar", "grammar_accepts"]


class GrammarError(ValueError):
    """llama.cpp cannot parse a GBNF grammar."""


def _sampler(lm: Any, grammar: str):
    """A llama.cpp grammar sampler for ``grammar`` over ``lm``'s vocabulary (free it), or GrammarError."""
    llama_cpp = import_llama_cpp()
    with quiet_native():  # llama.cpp prints its parse errors; the exception says what failed
        sampler = llama_cpp.llama_sampler_init_grammar(lm.llm._model.vocab, grammar.encode("utf-8"), b"root")
    if not sampler:
        first = grammar.strip().splitlines()[0][:120] if grammar.strip() else "(empty)"
        raise GrammarError(f"llama.cpp cannot parse this GBNF grammar (its first line: {first!r})")
    return sampler


def checked_grammar(lm: Any, grammar: str):
    """The ``llama_cpp.LlamaGrammar`` of ``grammar`` for ``lm`` (a :class:`~.llama_cpp_model.LlamaCppModel`),
    checked by llama.cpp once and kept in ``lm.grammars``; :class:`GrammarError` when it does not parse."""
    found = lm.grammars.get(grammar)
    if found is None:
        llama_cpp = import_llama_cpp()
        llama_cpp.llama_sampler_free(_sampler(lm, grammar))
        from llama_cpp.llama_grammar import LlamaGrammar

        found = lm.grammars[grammar] = LlamaGrammar.from_string(grammar, verbose=False)
    return found


def grammar_accepts(lm: Any, grammar: str, text: str) -> bool:
    """Whether ``grammar`` admits ``text`` as a whole reply: each of its tokens (``lm``'s tokenizer)
    passes llama.cpp's grammar sampler after the ones before it, and then an end-of-generation token
    does. The same engine that constrains generation decides, so a test of a method's grammar against
    the replies its parser accepts checks what generation will allow."""
    import math

    llama_cpp = import_llama_cpp()
    sampler = _sampler(lm, grammar)

    def allowed(token: int) -> bool:
        # the grammar masks each candidate on its own: a one-candidate array asks about that token only
        data = llama_cpp.llama_token_data(id=token, logit=0.0, p=0.0)
        array = llama_cpp.llama_token_data_array(data=ctypes.pointer(data), size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))
        return math.isfinite(data.logit)

    try:
        for token in lm.tokenize(text, special=False):
            if not allowed(token):
                return False
            llama_cpp.llama_sampler_accept(sampler, token)
        end = lm.eos_id
        return end is not None and allowed(end)
    finally:
        llama_cpp.llama_sampler_free(sampler)


class GreedyGrammar:
    """Greedy decoding under a grammar, the fast way: the model's own argmax is taken when the grammar
    admits it (one candidate checked), and only when it does not are all candidates masked and the best
    admitted one taken. That is the argmax of the masked distribution either way, so the tokens are those
    of llama.cpp's sampler chain with the grammar in it (tests/test_constrained.py), but the chain masks
    every candidate at every token: ~30 ms a token over Qwen's 151k-token vocabulary here, about what
    the 1.5B takes to decode one. llama.cpp's own ``common_sampler`` checks the chosen token first too.

    Used as llama-cpp-python's sampler (``sample(ctx, idx)``) for one ``generate``; :meth:`close` frees it.
    """

    def __init__(self, lm: Any, grammar: str) -> None:
        self._lm = lm
        self._sampler = _sampler(lm, grammar)

    def _admits(self, token: int) -> bool:
        llama_cpp = import_llama_cpp()
        data = llama_cpp.llama_token_data(id=token, logit=0.0, p=0.0)
        array = llama_cpp.llama_token_data_array(data=ctypes.pointer(data), size=1, selected=-1, sorted=False)
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))
        return data.logit != float("-inf")

    def sample(self, ctx: Any, idx: int = -1) -> int:
        from .llama_cpp_native import logits_row

        return self.choose(logits_row(ctx, idx, self._lm.n_vocab))

    def choose(self, row: Any) -> int:
        """The admitted token of highest logit in ``row`` (one logits row), accepted into the grammar's state."""
        import numpy as np

        llama_cpp = import_llama_cpp()
        token = int(np.argmax(row))
        if not self._admits(token):
            data = np.recarray((row.size,), dtype=np.dtype([("id", np.intc), ("logit", np.single), ("p", np.single)],
                                                           align=True))
            data.id[:], data.logit[:], data.p[:] = np.arange(row.size, dtype=np.intc), row, 0.0
            array = llama_cpp.llama_token_data_array(data=data.ctypes.data_as(llama_cpp.llama_token_data_p),
                                                     size=row.size, selected=-1, sorted=False)
            llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))
            kept = data[: array.size]
            token = int(kept.id[int(np.argmax(kept.logit))])
        llama_cpp.llama_sampler_accept(self._sampler, token)
        return token

    def close(self) -> None:
        if self._sampler is not None:
            import_llama_cpp().llama_sampler_free(self._sampler)
            self._sampler = None
