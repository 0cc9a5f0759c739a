"""CRP-RAG's declared reply forms (:mod:`tcrag_langgraph.methods.crp_rag.reply_forms`) against its
parsers, decided by llama.cpp's own grammar engine over the packaged GGUF's vocabulary, and a sampled
step of the packaged model under its form."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from tcrag_langgraph.core import answer_format
from tcrag_langgraph.methods.crp_rag import StepParseError, merged_step, parse_step
from tcrag_langgraph.methods.crp_rag.prompts import PROMPT_GENERATE
from tcrag_langgraph.methods.crp_rag.reply_forms import MERGE_FORM, STEP_FORM, answer_form
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_grammar import grammar_accepts

YNM = ("yes", "no", "maybe")


@pytest.fixture(scope="module")
def chat():
    return LlamaCppChatModel(n_threads=1, max_new_tokens=48)


def test_the_step_and_merge_forms_admit_what_the_parsers_read_and_nothing_around_it(chat):
    lm = chat.llama_model
    step = "Next step: Check whether the trial measured mortality.\nFinal: no"
    assert parse_step(step).text == "Check whether the trial measured mortality." and grammar_accepts(lm, STEP_FORM.grammar, step)
    assert not grammar_accepts(lm, STEP_FORM.grammar, "Sure! " + step)  # a preamble the parser would repair
    assert not grammar_accepts(lm, STEP_FORM.grammar, step.replace("Final: no", "Final: probably"))
    assert not grammar_accepts(lm, STEP_FORM.grammar, step + "\nNext step: another")
    merge = "Next step: Find the drug class of metformin."
    assert merged_step(merge) == "Find the drug class of metformin." and grammar_accepts(lm, MERGE_FORM.grammar, merge)
    assert not grammar_accepts(lm, MERGE_FORM.grammar, "To summarize the paragraphs, we can write:")


@pytest.mark.parametrize("reply, fits", [
    ("Answer: yes", True),
    ("The trial found lower mortality.\nSo the answer is positive.\nAnswer: Yes.", True),
    ("Answer: probably", False),
    ("Answer: yes\nbut maybe not", False),
])
def test_the_answer_form_ends_in_one_allowed_answer(chat, reply, fits):
    structured, problem = answer_format.check(YNM, answer_format.final_answer(reply, keep_label=False))
    assert (problem is None) is fits
    assert grammar_accepts(chat.llama_model, answer_form(YNM).grammar, reply) is fits
    assert answer_form(None) is None  # a free answer: nothing to constrain


def test_a_sampled_step_of_the_packaged_model_parses_under_its_form(chat):
    prompt = PROMPT_GENERATE.format(question="Does metformin lower blood glucose?", conditions="(none yet)")
    reply = chat.invoke([HumanMessage(content=prompt)], temperature=0.8, grammar=STEP_FORM.grammar)
    try:
        parsed = parse_step(reply.content)
    except StepParseError:  # the one check the grammar leaves to the parser: three letters in the step
        assert sum(ch.isalpha() for ch in reply.content.split("\n")[0][len("Next step: "):]) < 3
    else:
        assert not parsed.repairs or reply.response_metadata["finish_reason"] == "length", parsed
