"""Constrained generation (tcrag_langgraph.models.constrained): which model gets a method's declared
reply form and how, llama.cpp's grammar sampler behind LlamaCppChatModel on the packaged GGUF, and
what the log-probs of a constrained reply are.

Real components: the packaged SmolLM2 GGUF run by llama.cpp; llama.cpp's own grammar engine decides
what a grammar admits (``grammar_accepts``). The dispatch tests use a chat model that records what it
was sent, since what is checked there is what the kernel sends, not what a model makes of it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from tcrag_langgraph.core.config import TCRAGConfig
from tcrag_langgraph.core.kernel import RunKernel, fresh_run
from tcrag_langgraph.models.constrained import Constraint, ReplyForm, constraint_for, gbnf_literal
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_grammar import GrammarError, checked_grammar, grammar_accepts
from tcrag_langgraph.models.weights import default_model_source

FORCED = ReplyForm("forced", 'root ::= "Zebra crossing"\n')


@pytest.fixture(scope="module")
def chat():
    return LlamaCppChatModel(max_new_tokens=12, temperature=0.0, n_threads=1)


class Recording(BaseChatModel):
    """Answers a fixed text and keeps the keyword arguments of every call."""

    reply: str = "ok"
    calls: list = []

    @property
    def _llm_type(self) -> str:
        return "recording"

    def _generate(self, messages, stop=None, run_manager=None, **kwargs: Any) -> ChatResult:
        self.calls.append(kwargs)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self.reply))])


class TakesGrammar(Recording):
    takes_grammar: bool = True


def test_a_reply_form_needs_a_root_rule_and_a_renderer_with_its_schema():
    with pytest.raises(ValueError, match="root"):
        ReplyForm("x", 'start ::= "a"')
    with pytest.raises(ValueError, match="from_json"):
        ReplyForm("x", 'root ::= "a"', schema={"type": "string"})
    assert constraint_for(object(), None) is None


def test_gbnf_literal_is_read_back_by_llama_cpp_as_the_same_text(chat):
    text = 'He said "no" \\ then\tleft\n'
    grammar = f"root ::= {gbnf_literal(text)}"
    assert grammar_accepts(chat.llama_model, grammar, text)
    assert not grammar_accepts(chat.llama_model, grammar, text.replace('"', "'"))


def test_the_kernel_sends_the_form_only_to_a_model_that_takes_it_and_only_when_asked():
    kernel = RunKernel(TakesGrammar(reply="ok", calls=[]), [], None, TCRAGConfig())
    messages = [HumanMessage(content="hi")]
    kernel.ask(fresh_run(), messages, TCRAGConfig(), {}, form=FORCED)
    kernel.ask(fresh_run(), messages, TCRAGConfig(constrain_replies=False), {}, form=FORCED)
    kernel.ask(fresh_run(), messages, TCRAGConfig(), {})
    assert [c.get("grammar") for c in kernel.model.calls] == [FORCED.grammar, None, None]
    plain = RunKernel(Recording(calls=[]), [], None, TCRAGConfig())  # transformers, a scripted model, ...: nothing
    plain.ask(fresh_run(), messages, TCRAGConfig(), {}, form=FORCED)
    assert "grammar" not in plain.model.calls[0] and "response_format" not in plain.model.calls[0]


def test_a_json_schema_reply_is_rendered_into_the_forms_text_and_anything_else_is_left_to_the_parser():
    form = ReplyForm("pair", 'root ::= "a"', schema={"type": "object"}, from_json=lambda v: f"Step1: {v['step']}")
    constraint = Constraint("json_schema", {}, form)
    assert constraint.reply_text(json.dumps({"step": "Who?"})) == "Step1: Who?"
    assert constraint.reply_text('{"step": "cut by the bud') == '{"step": "cut by the bud'
    assert constraint.reply_text('{"other": 1}') == '{"other": 1}'
    assert Constraint("grammar", {}, form).reply_text('{"step": "x"}') == '{"step": "x"}'


def test_a_grammar_llama_cpp_cannot_parse_is_an_error_that_says_so_not_a_crash(chat):
    # llama-cpp-python would add llama.cpp's NULL sampler to its chain and crash at the next sample
    with pytest.raises(GrammarError, match="cannot parse this GBNF grammar"):
        chat.invoke([HumanMessage(content="Say hi")], grammar='root ::= "unclosed')


def test_the_reply_keeps_to_the_grammar_and_its_log_probs_are_the_models_own(chat):
    """llama.cpp's grammar sampler masks a copy of the logits; the log-probs of a constrained reply are
    read from the context's logits before any sampler, so a forced token carries the probability the
    model gave it (what docs/models.md says the monitor's generation values see)."""
    msgs = [HumanMessage(content="Say hi")]
    free = chat.invoke(msgs, logprobs=True, top_logprobs=5)
    forced = chat.invoke(msgs, logprobs=True, top_logprobs=5, grammar=FORCED.grammar)
    assert forced.content == "Zebra crossing" and not free.content.startswith("Z")
    first_free = free.response_metadata["logprobs"]["content"][0]
    first = forced.response_metadata["logprobs"]["content"][0]
    # the same unmasked distribution at the first position, tokens the grammar forbids included ...
    assert [t["token"] for t in first["top_logprobs"]] == [t["token"] for t in first_free["top_logprobs"]]
    assert first["top_logprobs"][0]["logprob"] == pytest.approx(first_free["top_logprobs"][0]["logprob"], abs=0.02)
    # ... and the forced token's own, lower, log-probability (a masked distribution would give it ~0)
    assert first["token"] == "Z" and first["logprob"] < first["top_logprobs"][-1]["logprob"] < 0


@pytest.mark.parametrize("grammar", [FORCED.grammar, 'root ::= ("Hello" | "Hi") " " [a-z]+ ( " " [a-z]+ ){0,6} "."'])
def test_greedy_decoding_under_a_grammar_gives_llama_cpps_own_sampler_chains_tokens(chat, grammar):
    """The chat model takes the model's argmax when the grammar admits it and masks all candidates only
    when not (GreedyGrammar); llama-cpp-python's chain masks every time. Same tokens, both paths taken
    (the forced grammar rejects the model's first choices, the second mostly admits them)."""
    msgs = [HumanMessage(content="Say hi to the new student")]
    ours = chat.invoke(msgs, grammar=grammar, max_new_tokens=20)
    lm = chat.llama_model
    with lm.lock:
        chain, generated = lm.llm.generate(lm.prompt_ids(msgs), temp=0.0, repeat_penalty=1.0, reset=True,
                                           grammar=checked_grammar(lm, grammar)), []
        for token in chain:
            if lm.is_eog(token) or len(generated) == 20:
                break
            generated.append(token)
        chain.close()
    assert ours.content == lm.detokenize(generated).strip() and ours.content


def test_a_constrained_call_decodes_without_the_draft_model():
    folder, name = default_model_source()
    spec = LlamaCppChatModel(max_new_tokens=8, temperature=0.0, n_threads=1, draft_model_path=str(folder / name))
    msgs = [HumanMessage(content="Say hi")]
    assert spec.invoke(msgs, grammar=FORCED.grammar).content == "Zebra crossing"
    assert spec.speculative_stats.proposed == 0  # the draft's argmax knows no grammar
    spec.invoke(msgs)
    assert spec.speculative_stats.proposed > 0


def test_both_local_backends_say_when_the_token_budget_ended_a_reply(chat):
    """``finish_reason`` as OpenAI's servers report it: what the kernel's ``reply_cut`` reads, so a parser
    may keep the complete part of a cut reply (KAG-Thinker's plan)."""
    from tcrag_langgraph.models.local import LocalChatModel

    msgs = [HumanMessage(content="Say hi to the new student")]
    assert chat.invoke(msgs, max_new_tokens=3).response_metadata["finish_reason"] == "length"
    assert chat.invoke(msgs, grammar=FORCED.grammar).response_metadata["finish_reason"] == "stop"
    assert chat.invoke(msgs, stop=[" "], max_new_tokens=12).response_metadata["finish_reason"] == "stop"
    torch_chat = LocalChatModel(max_new_tokens=2, temperature=0.0)  # transformers
    assert torch_chat.invoke(msgs).response_metadata["finish_reason"] == "length"
    assert torch_chat.invoke(msgs, stop=["Hello", "Hi", "hi", "hello", "!", "."]).response_metadata["finish_reason"] == "stop"
    kernel, work = RunKernel(chat, [], None, TCRAGConfig()), fresh_run()
    kernel.ask(work, msgs, TCRAGConfig(max_new_tokens=3), {})
    assert work["reply_cut"] is True
    kernel.ask(work, msgs, TCRAGConfig(max_new_tokens=12), {}, form=FORCED)
    assert work["reply_cut"] is False
