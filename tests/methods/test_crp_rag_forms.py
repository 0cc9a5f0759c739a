"""CRP-RAG's declared reply forms (:mod:`tcrag_langgraph.methods.crp_rag.reply_forms`) against its
parsers, decided by llama.cpp's own grammar engine over the packaged GGUF's vocabulary, and a sampled
step of the packaged model under its form."""

from __future__ import annotations

import json
import re

import pytest
from langchain_core.messages import HumanMessage
from llama_cpp.llama_grammar import json_schema_to_gbnf

from tcrag_langgraph.core import answer_format
from tcrag_langgraph.methods.crp_rag import StepParseError, merged_step, parse_step
from tcrag_langgraph.methods.crp_rag.prompts import PROMPT_GENERATE
from tcrag_langgraph.methods.crp_rag.reply_forms import (MAX_QUESTION_CHARS, MERGE_FORM, REASONING_LINES, STEP_FORM,
                                                          answer_form, answer_line_form, reasoning_chars)
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_grammar import grammar_accepts

YNM = ("yes", "no", "maybe")


@pytest.fixture(scope="module")
def chat():
    return LlamaCppChatModel(n_threads=1, max_new_tokens=48)


def test_the_step_and_merge_forms_admit_one_sub_question_the_parsers_read_and_nothing_around_it(chat):
    lm = chat.llama_model
    step = "Next step: Did the trial measure mortality?\nFinal: no"
    assert parse_step(step).text == "Did the trial measure mortality?" and grammar_accepts(lm, STEP_FORM.grammar, step)
    assert grammar_accepts(lm, STEP_FORM.grammar, "Next step: To what extent does age matter?\nFinal: yes")
    assert not grammar_accepts(lm, STEP_FORM.grammar, "Sure! " + step)  # a preamble the parser would repair
    assert not grammar_accepts(lm, STEP_FORM.grammar, step.replace("Final: no", "Final: probably"))
    assert not grammar_accepts(lm, STEP_FORM.grammar, step + "\nNext step: another")
    # what the 1.5B wrote instead of sub-questions (tv47crp): a research plan, a note of ignorance, two questions
    for not_a_sub_question in ("Conduct a study comparing leukocyte counts of injured and non-injured people.",
                               "If we don't know anything about the providers, it's not clear.",
                               "Did the trial measure mortality? Was it randomised?",
                               "What is " + "the " * (MAX_QUESTION_CHARS // 4) + "dose?"):
        assert not grammar_accepts(lm, STEP_FORM.grammar, f"Next step: {not_a_sub_question}\nFinal: no")
    merge = "Next step: Which drug class is metformin in?"
    assert merged_step(merge) == "Which drug class is metformin in?" and grammar_accepts(lm, MERGE_FORM.grammar, merge)
    assert not grammar_accepts(lm, MERGE_FORM.grammar, "To summarize the paragraphs, we can write:")
    assert not grammar_accepts(lm, MERGE_FORM.grammar, "Next step: Find the drug class of metformin.")


def test_the_schemas_ask_for_the_sub_question_the_grammar_admits(chat):
    pattern = re.compile(STEP_FORM.schema["properties"]["next_step"]["pattern"])
    assert pattern.match("Did the trial measure mortality?") and pattern.match("In which organ does it act?")
    assert not pattern.match("Conduct a study.") and not pattern.match("Is it? Was it?")
    assert MERGE_FORM.schema["properties"]["next_step"]["pattern"] == pattern.pattern
    # what llama-cpp-python's server makes of the schema (its own converter) holds the step to the pattern too
    served = json_schema_to_gbnf(json.dumps(STEP_FORM.schema))
    assert grammar_accepts(chat.llama_model, served, json.dumps({"next_step": "Is it safe?", "final": True}))
    assert not grammar_accepts(chat.llama_model, served, json.dumps({"next_step": "Conduct a study.", "final": True}))
    assert STEP_FORM.from_json({"next_step": "Is it safe?", "final": True}) == "Next step: Is it safe?\nFinal: yes"


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


def test_the_answer_forms_reasoning_fits_the_replys_budget_and_a_re_prompt_asks_the_answer_line_alone(chat):
    lm, form = chat.llama_model, answer_form(YNM, max_new_tokens=150)
    per_line = reasoning_chars(150) // REASONING_LINES
    line = ("The trial found lower mortality " * 10)[:per_line]
    assert grammar_accepts(lm, form.grammar, "\n".join([line] * REASONING_LINES) + "\nAnswer: yes")
    assert not grammar_accepts(lm, form.grammar, "\n".join([line] * (REASONING_LINES + 1)) + "\nAnswer: yes")
    assert not grammar_accepts(lm, form.grammar, line + "s\nAnswer: yes")  # one character over the line's room
    assert form.schema["properties"]["reasoning"]["maxLength"] == reasoning_chars(150)
    # a budget with no room for reasoning leaves the answer line alone, as does the re-prompt's form
    assert answer_form(YNM, max_new_tokens=16).grammar == answer_line_form(YNM).grammar
    assert grammar_accepts(lm, answer_line_form(YNM).grammar, "Answer: No.")
    assert not grammar_accepts(lm, answer_line_form(YNM).grammar, "It did.\nAnswer: no")
    assert answer_line_form(None) is None and answer_line_form("free text") is None


def test_the_packaged_model_reaches_the_answer_line_within_a_small_budget():
    """Under the old form (free lines, then the answer) the packaged model, asked to explain, wrote until the
    budget cut it and never wrote the answer line; under the bounded form the reply ends in it."""
    chat = LlamaCppChatModel(n_threads=1, max_new_tokens=40)
    prompt = ("Explain in detail, step by step, how metformin lowers blood glucose, and then answer: "
              "does metformin lower blood glucose? End with a line 'Answer: yes', 'Answer: no' or 'Answer: maybe'.")
    reply = chat.invoke([HumanMessage(content=prompt)], temperature=0, grammar=answer_form(YNM, max_new_tokens=40).grammar)
    assert reply.response_metadata["finish_reason"] == "stop", reply.content
    structured, problem = answer_format.check(YNM, answer_format.final_answer(reply.content, keep_label=False))
    assert problem is None and structured in YNM
    unbounded = 'root ::= ( [^\\n]* "\\n" )* "Answer: " ( "yes" | "no" | "maybe" ) "."?\n'
    cut = chat.invoke([HumanMessage(content=prompt)], temperature=0, grammar=unbounded)
    assert cut.response_metadata["finish_reason"] == "length" and "Answer:" not in cut.content
