"""CRP-RAG's prompts (paper appendix A: A.1 next step, A.2 merge, A.3 aggregation, A.4 reasoning,
A.5 integration) and the re-prompt and last-step notes."""

from __future__ import annotations

__all__ = [
    "PROMPT_GENERATE",
    "PROMPT_MERGE",
    "PROMPT_AGGREGATE",
    "PROMPT_REASON",
    "PROMPT_PATH_STEP",
    "LAST_STEP_NOTE",
    "PROMPT_INTEGRATE",
    "PROMPT_SETTLE",
    "STEP_FORMAT_HELP",
]

# --------------------------------------------------------------------------------------------
# Prompts (paper appendix A; the reply formats are ours, so replies can be parsed). The appendix's
# "generated examples" are left out: Qwen2.5-Coder-0.5B copied a concrete example step verbatim
# into the graph and an example summary into a node's knowledge; forms use <placeholders> instead.
# --------------------------------------------------------------------------------------------

# Requirement 2 and the reply line ask for a sub-question only, the form reply_forms.STEP_FORM admits (why: there)
PROMPT_GENERATE = """Please propose the next reasoning step to answer the given question based on the provided conditions. Requirements:
1. The content of the next reasoning step must be grounded on the known conditions.
2. The next reasoning step is one sub-question that needs to be answered to address the given question based on the known conditions.
3. If the answer to this sub-question answers the given question, it is the final step.
Reply with exactly two lines:
Next step: <the sub-question, one sentence ending in '?'>
Final: <yes if its answer answers the question, otherwise no>

The question is: {question}
The known conditions are: {conditions}"""

PROMPT_MERGE = """Please merge the information from the multiple given text paragraphs to create a text summary that includes the complete content of all paragraphs. The requirements for the content are:
1. Summarize and abstract the information commonly mentioned in each paragraph.
2. Integrate and list the content uniquely mentioned in each paragraph.
3. Annotate any conflicting information mentioned across the paragraphs.
Reply with exactly one line:
Next step: <the merged sub-question, one sentence ending in '?'>

The question is: {question}
The collection of text paragraphs are:
{paragraphs}"""

PROMPT_AGGREGATE = """Please merge the relevant knowledge from the multiple search results provided and generate a knowledge summary based on the existing search result content. The content requirements are as follows:
1. Organize and summarize the knowledge related to the theme in the search results (the points they have in common), and provide relevant concepts and examples of the knowledge.
2. Organize and summarize the knowledge that is not commonly mentioned in each search result (the points unique to one result) by theme type and list them in bullet points.
3. When knowledge mentioned in the search results conflicts, judge the rationality of their content based on information such as time, location, and field, and delete unreasonable knowledge. If all conflicting knowledge is unreasonable, delete it all.

Write it in this form:
Common points: <what several results say>
Unique points:
- <what only one result says>
Conflicts: <what was judged and dropped, or none>

The question is: {step}
The retrieval results are:
{results}"""

PROMPT_REASON = """Please answer the question according to the relevant knowledge.
The question is: {step}
The relevant knowledge are: {knowledge}"""

PROMPT_PATH_STEP = """Answer the current reasoning step using the known conditions and the relevant knowledge. Be brief.
The question is: {question}
The known conditions are: {conditions}
The current reasoning step is: {step}
The relevant knowledge are: {knowledge}{last}"""

LAST_STEP_NOTE = "\nThis is the last step: end with a line 'Answer: <the answer to the question>'."

PROMPT_INTEGRATE = """Given that there are several corresponding answers to a question, all of which are derived through reasonable inference, please organize all the corresponding answers based on the question to form a final answer. The content requirements are as follows:
1. Merge answers with similar content.
2. List all different types of answers and provide the corresponding reasoning process and evidence for each answer.
End with a line 'Answer: <the final answer to the question>'.

The question is: {question}
The answer set is:
{answers}"""

# Not in the paper: prompt A.4 over the question's own retrieval, asked when the paths left it open
# (CRPRAGOptions.open_answer; why: docs/crp-rag.md, "Open answers")
PROMPT_SETTLE = """Please answer the question according to the relevant knowledge retrieved for it.
The question is: {question}
The relevant knowledge are:
{knowledge}
End with a line 'Answer: <the answer to the question>'."""

STEP_FORMAT_HELP = "Reply with exactly two lines:\nNext step: <the sub-question, one sentence ending in '?'>\nFinal: <yes or no>"
