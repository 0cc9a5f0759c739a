"""KAG-Thinker's declared reply forms (:mod:`tcrag_langgraph.methods.kag_thinker.reply_forms`) against
its parsers, decided by llama.cpp's own grammar engine over the packaged GGUF's vocabulary: the plan
grammar admits the plans a correct answer needs and refuses what the parser refuses (the failures of
issue 41: references to missing steps, unknown functions and operators, steps without actions); what
the grammar lets a model write, the parsers read; and a run with the packaged 135M model, which does
not write the format unconstrained (docs/kag-thinker.md), gets a plan through."""

from __future__ import annotations

import pytest
from langchain_core.messages import HumanMessage

from tcrag_langgraph.methods.kag_thinker import KAGThinker, LogicalFormParseError, parse_focus, parse_logical_forms
from tcrag_langgraph.methods.kag_thinker.prompts import (
    DECOMPOSE_EXAMPLE_QUESTION,
    DECOMPOSE_EXAMPLE_REPLY,
    DECOMPOSE_INSTRUCTIONS,
)
from tcrag_langgraph.methods.kag_thinker.reply_forms import (
    DEDUCE_FORM,
    MATH_FORM,
    MAX_CONTENT_ITEMS,
    MAX_TERMS,
    answer_choice_form,
    focus_form,
    plan_form,
)
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_grammar import grammar_accepts

ONE = "Step1: What does X treat?\nAction1: Retrieval(s=s1:drug['X'], p=p1:treats, o=o1:disease)\n"


@pytest.fixture(scope="module")
def lm():
    return LlamaCppChatModel(n_threads=1).llama_model


@pytest.mark.parametrize("plan", [
    DECOMPOSE_EXAMPLE_REPLY,  # the prompt's own demonstration (variables as the paper writes them)
    DECOMPOSE_EXAMPLE_REPLY.replace("s=o1", "s=#1").replace("s=o3", "s=#3"),
    ONE + "Step2: Output #1.\nAction2: Output(#1)",
    ONE.rstrip(),  # no Output: the parser adds Output(#1)
    ONE + "Step2: How many patients had #1?\nAction2: Retrieval(s=o1, p=p2:count, o=o2:number)\n"
          "Step3: Twice #2\nAction3: Math(content=['#2', '2'], target='(#2 + 0.5) * 2')->m3\n"
          "Step4: Is #3 above 10?\nAction4: Deduce(op=judgement, content=['#3', 'the threshold'], target='is #3 above 10')\n"
          "Step5: Output #3 and #4.\nAction5: Output(#3, #4)",
])
def test_the_plan_grammar_admits_the_plans_the_parser_reads(lm, plan):
    assert parse_logical_forms(plan).forms  # the parser's own reading first
    assert grammar_accepts(lm, plan_form(6).grammar, plan)


@pytest.mark.parametrize("plan, parser_says", [
    (ONE.replace("What does X treat?", "What does #1 treat?"), "not an earlier step"),
    (ONE + "Step2: Output it.\nAction2: Output(#2)\nStep3: x\nAction3: Output(#1)", "Output must be the last"),
    (ONE + "Step2: List.\nAction2: Output(#3)", "not an earlier step"),
    (ONE + "Step2: Compare.\nAction2: Deduce(op=compare, content=['#1'], target='which')", "Deduce op"),
    (ONE + "Step2: Look.\nAction2: Summon(s=#1)", "unknown logical function"),
    (ONE + "Step2: What else?\nStep3: Output.\nAction3: Output(#1)", "Step2 has no Action"),
    (ONE + "Step3: Output.\nAction3: Output(#1)", "numbered"),
    ("Step1: Twice 3\nAction1: Math(content=['3'], target='3 * 2')->m1\n"
     "Step2: What is o1?\nAction2: Retrieval(s=o1, p=p2:r, o=o2:y)", "no earlier action defined"),
])
def test_the_plan_grammar_refuses_what_the_parser_refuses(lm, plan, parser_says):
    with pytest.raises(LogicalFormParseError, match=parser_says):
        parse_logical_forms(plan)
    assert not grammar_accepts(lm, plan_form(6).grammar, plan)


def test_the_plan_grammar_bounds_the_forms_and_ends_the_reply(lm):
    two = ONE + "Step2: Output #1.\nAction2: Output(#1)"
    assert plan_form(1) is None  # no plan fits one form: a Retrieval needs the Output after it
    assert grammar_accepts(lm, plan_form(2).grammar, two)
    assert not grammar_accepts(lm, plan_form(2).grammar, ONE + "Step2: More?\nAction2: Retrieval(s=#1, p=p2:r, o=o2:y)")
    assert not grammar_accepts(lm, plan_form(6).grammar, two + "\nAnd that is the plan.")  # nothing after the Output


def test_the_plan_grammar_bounds_math_and_deduce_where_the_15b_ran_away(lm):
    """Two trainval plans (issue 41) were a Math of constants at step 1 whose content list or target the
    1.5B repeated until the token limit, identically on every retry: a Math computes over an earlier
    answer (so not at step 1), and its lists and expressions are bounded."""
    math = "Step2: Double #1\nAction2: Math(content=[{items}], target='{target}')->m2"
    assert parse_logical_forms("Step1: Twice 3\nAction1: Math(content=['3'], target='3 * 2')->m1").forms  # the parser reads it
    assert not grammar_accepts(lm, plan_form(6).grammar, "Step1: Twice 3\nAction1: Math(content=['3'], target='3 * 2')->m1")
    assert grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items="'#1', '2'", target="#1 * 2"))
    assert not grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items="'2', '#1'", target="#1 * 2"))
    eight = ", ".join(["'#1'"] + ["'3'"] * (MAX_CONTENT_ITEMS - 1))
    assert grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items=eight, target="#1"))
    assert not grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items=eight + ", '3'", target="#1"))
    longest = " + ".join(["#1"] * MAX_TERMS)
    assert grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items="'#1'", target=longest))
    assert not grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items="'#1'", target=longest + " + 1"))
    assert not grammar_accepts(lm, plan_form(6).grammar, ONE + math.format(items="'#1'", target="max/min" + "/round" * 9 + "(#1)"))
    deduce = "Step2: Judge.\nAction2: Deduce(op=judgement, content=[{items}], target='is #1 true')"
    assert grammar_accepts(lm, plan_form(6).grammar, ONE + deduce.format(items=", ".join(["'#1'"] * MAX_CONTENT_ITEMS)))
    assert not grammar_accepts(lm, plan_form(6).grammar, ONE + deduce.format(items=", ".join(["'#1'"] * (MAX_CONTENT_ITEMS + 1))))
    assert not grammar_accepts(lm, MATH_FORM.grammar, "<expression>" + " + ".join(["1"] * (MAX_TERMS + 1)) + "</expression>")


def test_the_other_forms_admit_what_their_parsers_read(lm):
    answer = "<focus>Reference 0 names it.</focus>\n<answer>Marfan syndrome</answer>"
    step = "<focus>Nothing yet.</focus>\nStep: Where was #1 born?\nAction: Retrieval(s=#1, p=p2:birthplace, o=o2:place)"
    assert parse_focus(answer, index=2).answer == "Marfan syndrome" and grammar_accepts(lm, focus_form(2).grammar, answer)
    assert parse_focus(step, index=2).next_form is not None and grammar_accepts(lm, focus_form(2).grammar, step)
    assert not grammar_accepts(lm, focus_form(1).grammar, step)  # sub-question 1 has no earlier answer
    assert grammar_accepts(lm, DEDUCE_FORM.grammar, "Both facts agree. <answer>yes</answer>")
    assert grammar_accepts(lm, MATH_FORM.grammar, "<expression>round((#1 + 2.5) * 3)</expression>")
    assert not grammar_accepts(lm, MATH_FORM.grammar, "<expression>#1 plus two</expression>")
    choices = answer_choice_form(("yes", "no", "maybe")).grammar
    assert grammar_accepts(lm, choices, "<answer>maybe</answer>") and not grammar_accepts(lm, choices, "<answer>perhaps</answer>")
    assert grammar_accepts(lm, choices, "21 of 40 improved, so yes.\n<answer>yes</answer>")
    assert not grammar_accepts(lm, choices, "so <b>yes</b> <answer>yes</answer>")


@pytest.mark.parametrize("seed", [1, 2])
def test_every_plan_the_grammar_lets_a_model_write_parses(seed):
    """Sampled at temperature 1 (far from what a model prefers) under the grammar: a reply the grammar
    ended parses as it is, and one the budget cut parses with its unfinished step left out, or was cut
    inside its first step (nothing to keep)."""
    chat = LlamaCppChatModel(n_threads=1, temperature=1.0, seed=seed, max_new_tokens=120)
    messages = [HumanMessage(content=DECOMPOSE_INSTRUCTIONS.format(max_forms=3)),
                HumanMessage(content=f"Question: {DECOMPOSE_EXAMPLE_QUESTION}")]
    reply = chat.invoke(messages, grammar=plan_form(3).grammar)
    cut = reply.response_metadata["finish_reason"] == "length"
    if not cut:
        assert grammar_accepts(chat.llama_model, plan_form(3).grammar, reply.content)
    try:
        plan = parse_logical_forms(reply.content, max_forms=3, cut=cut)
    except LogicalFormParseError:
        assert cut and reply.content.count("Step") == 1, reply.content
    else:
        assert 2 <= len(plan.forms) <= 3 and plan.forms[-1].function == "Output", reply.content


def test_a_run_of_the_packaged_model_gets_its_plan_through_the_grammar():
    model = LlamaCppChatModel(n_threads=1)
    config = {"max_new_tokens": 160, "temperature": 0.0, "max_format_retries": 0}
    graph = KAGThinker.build(model=model, tools=[], config=config,
                             options={"max_logical_forms": 3, "knowledge_boundary": False})
    question = {"question": "Which phenotypes are associated with Marfan syndrome?"}
    out = graph.invoke(question)
    plan_errors = [e for e in out["trace"] if e.action == "Logical_Form" and e.op == "format_error"]
    assert not plan_errors, plan_errors[0].detail
    assert out["forms"] and out["forms"][-1]["function"] == "Output"
    assert out["halt_reason"] != "format_error", out["error"]
    # the same run, parse-and-repair only: the 135M model repeats o= arguments until the budget cuts it
    free = graph.invoke(question, context={"constrain_replies": False})
    assert free["halt_reason"] == "format_error" and not free["forms"]



def test_a_focus_that_copies_the_prompts_blanks_is_refused_by_the_form(lm):
    """The 1.5B answered a depth turn with the prompt's own "<focus>...</focus> <answer>...</answer>" on all three
    tries (a format error on trainval): the parser refuses it, and the form no longer lets it be written."""
    copied = "<focus>...</focus>\n<answer>...</answer>"
    with pytest.raises(LogicalFormParseError, match="placeholder"):
        parse_focus(copied, index=1)
    assert not grammar_accepts(lm, focus_form(1).grammar, copied)
    assert not grammar_accepts(lm, focus_form(1).grammar, "<focus>It says so.</focus>\n<answer>...</answer>")
    assert not grammar_accepts(lm, focus_form(1).grammar, "<focus>...</focus>\n<answer>yes</answer>")
    assert grammar_accepts(lm, focus_form(1).grammar, "<focus></focus>\n<answer>yes</answer>")  # an empty focus is no copy

