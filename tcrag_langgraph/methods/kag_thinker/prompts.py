"""The prompts of KAG-Thinker (the paper's Tables 1-4, adapted to this package's four functions and tools)."""

from __future__ import annotations

DECOMPOSE_INSTRUCTIONS = """You decompose a user question into logical steps that can each be solved on their own.
Functions:
- Retrieval: look up a fact (subject, predicate, object). Usage: Retrieval(s=s1:type['name'], p=p1:relation, o=o1:type)
- Math: compute a number. Usage: Math(content=['#1', '#2'], target='arithmetic expression, e.g. #1 + #2')->m1
- Deduce: reason over earlier answers. Usage: Deduce(op=extract|judgement|entailment|choice|multiChoice, content=['#1', '#2'], target='what to decide')->d1
- Output: give the final answer. Usage: Output(#n)
Rules: write StepN (the sub-question in words) and ActionN (the function) for every step; use #1 for the
answer of Step1, #2 for Step2, and so on (only earlier steps); at most {max_forms} steps; the last step is Output."""

DECOMPOSE_EXAMPLE_QUESTION = "Which film has the director who died first, Hit Parade Of 1947 or Khiladi 420?"
DECOMPOSE_EXAMPLE_REPLY = """Step1: Who is the director of Hit Parade Of 1947?
Action1: Retrieval(s=s1:film['Hit Parade Of 1947'], p=p1:director, o=o1:person)
Step2: When did #1 die?
Action2: Retrieval(s=o1, p=p2:deathtime, o=o2:date)
Step3: Who is the director of Khiladi 420?
Action3: Retrieval(s=s3:film['Khiladi 420'], p=p3:director, o=o3:person)
Step4: When did #3 die?
Action4: Retrieval(s=o3, p=p4:deathtime, o=o4:date)
Step5: Which film was directed by the director who died first according to #2 and #4?
Action5: Deduce(op=choice, content=['#2', '#4'], target='which film was directed by the director who died first')->d5
Step6: Output #5.
Action6: Output(#5)"""

BOUNDARY_PROMPT = """Can you answer the following question step by step?
If you can, wrap your answer with <answer>\\boxed{{your answer}}</answer>.
If you can't, just reply that based on my internal knowledge, I can't answer this question, I need to retrieve external knowledge.
Question: {question}"""

CONFIDENCE_PROMPT = """Analyze whether the answer to the following question is correct?
Please think step-by-step before arriving at your conclusion.
If yes, answer True; if no, answer False.
Wrap your answer with <answer>\\boxed{{True/False}}</answer>.
Question: {question}
Answer: {answer}"""

FOCUS_PROMPT = """According to the question and references, find what in the references answers the question.
Write them as <focus>...</focus>.
If the references answer the question, then write the answer as <answer>...</answer>.
If they do not, write the next search instead:
Step: (the sub-question to search for next)
Action: Retrieval(s=..., p=..., o=...)
{known}References:
{references}
Question: {question}"""

# The known facts are the earlier steps' answers; a choice's literal options are shown as choices, not as
# facts (the 1.5B, shown "Known facts: yes / no / maybe" and nothing else, reasoned that nothing was known
# and answered "maybe": 19 of its 42 "maybe" on issue 41's test questions)
DEDUCE_PROMPT = """Reason to reach the target ({op}).
Known facts:
{content}
{choices}Target: {target}
Original question: {question}
In one or two sentences say what the known facts, and what you know of the subject, show about the target; then wrap the result in <answer>...</answer>."""

#: the known facts of a Deduce whose inputs are all literal options (no earlier step's answer)
NO_KNOWN_FACTS = "(none retrieved: reason from what you know)"

# Asked only when the referenced answers do not fit the answer format (a Math result "21", a retrieved
# "0.6 mm/mo."). Each finding is shown beside its sub-question, and one or two sentences come before the
# answer: shown a bare number and told to write just yes, no or maybe, the 1.5B wrote "maybe" (2 of the 4
# non-Deduce Outputs of issue 41's trainval run tv48b, both wrong)
OUTPUT_PROMPT = """Question: {question}
What its sub-questions found:
{facts}
Answer so far: {answer}
In one or two sentences say which answer these findings, and what you know of the subject, support; then write the final answer in <answer>...</answer>.
{rule}"""

MATH_PROMPT = """Write one arithmetic expression (numbers, + - * / ** and parentheses only) that computes the target.
Known facts:
{content}
Target: {target}
Wrap the expression in <expression>...</expression>."""
