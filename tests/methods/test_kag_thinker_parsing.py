"""KAG-Thinker's strict parser of logical forms (:mod:`tcrag_langgraph.methods.kag_thinker.parsing`):
references and bindings, format repairs, and the rejections whose messages are written for the model."""

from __future__ import annotations

import pytest

from tcrag_langgraph.methods.kag_thinker import LogicalFormParseError, parse_logical_forms

PAPER_PLAN = """<think>This is a comparison problem.</think>
<answer>Step1: Who is the director of Hit Parade Of 1947?
Action1: Retrieval(s=s1:film['Hit Parade Of 1947'], p=p1:director, o=o1:director)
Step2: When did #1 die?
Action2: Retrieval(s=o1, p=p2:deathtime, o=o2:deathtime)
Step3: Who is the director of Khiladi 420?
Action3: Retrieval(s=s3:film['Khiladi 420'], p=p3:director, o=o3:director)
Step4: When did #3 die?
Action4: Retrieval(s=o3, p=p4:deathtime, o=o4:deathtime)
Step5: Which film was directed by the director who died first according to #2 and #4?
Action5: Deduce(op=choice, content=['o2', 'o4'], target='which film was directed by the director who died first according to o2 and o4')->o5
</answer>"""


def test_parse_paper_plan_references_and_bindings():
    plan = parse_logical_forms(PAPER_PLAN)
    assert [f.function for f in plan.forms] == ["Retrieval"] * 4 + ["Deduce", "Output"]
    assert [f.references for f in plan.forms] == [[], [1], [], [3], [2, 4], [5]]
    deduce = plan.forms[4]
    assert deduce.op == "choice"
    assert [c.step for c in deduce.content] == [2, 4]
    assert deduce.bindings["o2"].step == 2 and deduce.bindings["#4"].step == 4
    # A named subject stands for its name, the object for the step's answer.
    assert plan.forms[0].defines["s1"].text == "Hit Parade Of 1947"
    assert plan.forms[0].defines["o1"].step == 1
    assert plan.repairs == ["no Output step: Output(#5) added"]


def test_parse_repairs_formatting_variants():
    text = ("**Step 1：** What is the dose of #x?\n**Action 1:** retrival(s=s1:drug['aspirin'], p=p1:dose, o=o1:dose)\n"
            "Step: Double it.\nAction2: Math(content=['#1'], target='#1 * 2')->m2\n"
            "Step3: Output #2\nAction3: OUTPUT(m2)")
    plan = parse_logical_forms(text)
    assert [f.function for f in plan.forms] == ["Retrieval", "Math", "Output"]
    assert plan.forms[2].references == [2]
    assert any("matched to Retrieval" in r for r in plan.repairs)
    assert any("Step without a number read as Step2" in r for r in plan.repairs)


@pytest.mark.parametrize("text, message", [
    ("Nothing structured here.", "no logical forms"),
    ("Step1: Who?\nAction1: Retrieval(s=s1:x['a'], p=p1:r, o=o1:y)\nStep3: What?\nAction3: Output(#1)", "numbered"),
    ("Step1: When did #1 die?\nAction1: Retrieval(s=s1:p['x'], p=p1:death, o=o1:date)", "not an earlier step"),
    ("Step1: A?\nAction1: Retrieval(s=s1:p['x'], p=p1:r, o=o1:y)\nStep2: B?\nAction2: Retrieval(s=o9, p=p2:r, o=o2:y)",
     "no earlier action defined"),
    ("Step1: A?\nAction1: Summon(x=1)", "unknown logical function"),
    ("Step1: A?\nAction1: Retrieval(s=s1:p['x'], p=p1:r, o=o1:y)\nStep2: Out\nAction2: Output(#1)\n"
     "Step3: More?\nAction3: Retrieval(s=o1, p=p3:r, o=o3:y)", "Output must be the last"),
    ("Step1: A?\nStep2: B?\nAction2: Output(#1)", "Step1 has no Action"),
    ("Step1: A?\nAction1: Output('plain text')", "Output takes references"),
    ("Step1: A?\nAction1: Deduce(op=guess, content=['x'], target='y')", "Deduce op"),
    ("Step1: A?\nAction1: Math(content=['#2'], target='1+1')", "not an earlier step"),
    ("Step1: A?\nAction1: Retrieval(s=s1:x, p=p1:r, o=o1:y, o=o2:y)", "sets o more than once"),
])
def test_parse_rejects_with_a_message_for_the_model(text, message):
    with pytest.raises(LogicalFormParseError, match=message):
        parse_logical_forms(text)


def test_a_plan_the_token_budget_cut_keeps_its_complete_steps_only_when_known_cut():
    complete = ("Step1: Who directed X?\nAction1: Retrieval(s=s1:film['X'], p=p1:director, o=o1:person)\n"
                "Step2: When did #1 die?\nAction2: Retrieval(s=o1, p=p2:death, o=o2:date)\n")
    cut = complete + "Step3: Which film was directed by the director who died first according to #2 and \nAct"
    with pytest.raises(LogicalFormParseError, match="Step3 has no Action"):
        parse_logical_forms(cut)  # a reply the model ended itself is never shortened
    plan = parse_logical_forms(cut, cut=True)
    assert [f.function for f in plan.forms] == ["Retrieval", "Retrieval", "Output"] and plan.forms[2].references == [2]
    assert plan.repairs[-1] == "the reply was cut off by the token budget: its unfinished Step3 was left out"
    with pytest.raises(LogicalFormParseError, match="Action1 must be a call"):  # nothing complete to keep
        parse_logical_forms("Step1: Who directed X?\nAction1: Retriev", cut=True)
    # the complete steps do not parse either (a forward reference): the reply's own first error stands
    with pytest.raises(LogicalFormParseError, match="Step3 has no Action"):
        parse_logical_forms(complete.replace("When did #1", "When did #2") + "Step3: Which", cut=True)


def test_parse_reads_an_output_of_itself_as_the_answer_before_it():
    # What Qwen2.5-Coder-0.5B wrote for a one-hop question.
    text = ("Step1: Identify the phenotypes associated with Marfan syndrome.\nAction1: Retrieval(s=s1:phenotype"
            "['Marfan syndrome'], p=p1:phenotype, o=o1:phenotype)\nStep2: List the phenotypes.\nAction2: Output(#2)")
    plan = parse_logical_forms(text)
    assert plan.forms[1].references == [1] and plan.repairs == ["Action2: Output(#2) read as Output(#1)"]
    with pytest.raises(LogicalFormParseError, match="not an earlier step"):
        parse_logical_forms(text.replace("Output(#2)", "Output(#3)"))
    with pytest.raises(LogicalFormParseError, match="not an earlier step"):
        parse_logical_forms("Step1: A\nAction1: Output(#1)")


def test_parse_bounds_the_number_of_forms():
    text = "\n".join(f"Step{i}: Q{i}?\nAction{i}: Retrieval(s=s{i}:x['e{i}'], p=p{i}:r, o=o{i}:y)" for i in range(1, 5))
    assert len(parse_logical_forms(text, max_forms=5).forms) == 5  # four + the added Output
    with pytest.raises(LogicalFormParseError, match="at most 4 steps"):
        parse_logical_forms(text, max_forms=4)
    with pytest.raises(ValueError):
        parse_logical_forms(text, max_forms=0)


def test_a_quoted_word_that_looks_like_a_variable_is_text():
    # What Qwen2.5-Coder-0.5B wrote for a PubMedQA trainval question: 'T4' is a tumour stage.
    text = ("Step1: Should direct mesocolon invasion be included in T4?\nAction1: Deduce(op=choice, "
            "content=['T4', 'staging'], target='should it be T4')->d1\nStep2: Output #1.\nAction2: Output(#1)")
    plan = parse_logical_forms(text)
    assert [c.text for c in plan.forms[0].content] == ["T4", "staging"] and plan.forms[0].references == []
    assert plan.forms[1].references == [1]
    # a quoted known variable is still a reference, and a bare unknown one is still refused
    known = ("Step1: A?\nAction1: Retrieval(s=s1:p['x'], p=p1:r, o=o1:y)\n"
             "Step2: B?\nAction2: Deduce(op=extract, content=['o1', 'T4'], target='b')")
    assert [c.step for c in parse_logical_forms(known).forms[1].content] == [1, None]
    with pytest.raises(LogicalFormParseError, match="no earlier action defined"):
        parse_logical_forms(known.replace("['o1', 'T4']", "[o1, T4]"))
