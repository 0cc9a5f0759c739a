"""KAG-Thinker (kag-thinker.md, section 3 and appendix A) as a LangGraph graph on TC-RAG's parts.

The question is decomposed once, breadth-wise, into *logical forms*: each a natural-language
sub-question (``Step``) and a logical function (``Action``: ``Retrieval``, ``Math``, ``Deduce`` or
``Output``) that may use earlier answers through ``#n`` (or the variables an earlier action bound,
such as ``o1``). The forms are then solved in order:

* ``Retrieval``: *knowledge-boundary determination* (section 3.2, "generate first, then assess"):
  the model answers from its own knowledge, then the answer is kept only when BOTH the model's
  stated confidence (a True/False self-check) and the likelihood test (the lowest token
  probability of the answer, from the scorer's ``token_logprobs``, at least ``min_token_prob``)
  pass. Otherwise *depth solving* (section 3.1.2, 3.3): retrieve with the tools (through
  :func:`~tcrag_langgraph.tools.layer.invoke_tool`), focus on what answers the sub-question, then
  answer or issue the next Retrieval logical form, for at most ``max_depth_turns`` turns.
* ``Math``: an arithmetic expression (the form's target, or one the model writes) evaluated by
  :func:`evaluate_arithmetic`, an AST walker over a whitelist of node types (never ``eval``).
* ``Deduce``: the model reasons over the referenced answers (op extract / judgement / entailment /
  choice / multiChoice).
* ``Output``: the referenced answers are the final answer.

Model text is parsed strictly into typed pydantic models (:func:`parse_logical_forms`), with
format repairs recorded and a re-prompt naming the problem, at most ``max_format_retries`` times.

Layout (one concern a module): :mod:`.options` (:class:`KAGThinkerOptions`), :mod:`.forms` (the
typed logical forms), :mod:`.text` and :mod:`.parsing` (the strict parser of logical forms),
:mod:`.replies` (the other model replies), :mod:`.arithmetic` (safe Math), :mod:`.prompts`,
:mod:`.state` (:class:`KAGThinkerState`), :mod:`.retrieval` (knowledge boundary, depth solving),
:mod:`.nodes` (the other nodes) and :mod:`.graph` (:class:`KAGThinker`, the node holder that names
them and holds what every node shares).

Example:
    >>> from tcrag_langgraph.testing import ScriptedChatModel, ScriptedReply
    >>> replies = ["Step1: What is 6 times 7?\\nAction1: Math(content=[], target='6*7')->m1\\n"
    ...            "Step2: Output #1.\\nAction2: Output(#1)"]
    >>> model = ScriptedChatModel(replies=[ScriptedReply(reply=r) for r in replies], mode="sequence")
    >>> graph = KAGThinker.build(model=model, tools=[], options={"knowledge_boundary": False})
    >>> out = graph.invoke({"question": "What is 6 times 7?"})
    >>> out["answer"], out["halt_reason"], out["llm_calls"]
    ('42', 'answered', 1)
"""

from .arithmetic import ArithmeticRefused, evaluate_arithmetic
from .forms import ContentItem, LogicalForm, LogicalFormParseError, LogicalPlan
from .graph import NODE_NAMES, KAGThinker
from .options import KAGThinkerOptions
from .parsing import parse_logical_forms
from .replies import FocusResult, parse_boundary_answer, parse_confidence, parse_focus
from .state import KAGThinkerState

__all__ = [
    "KAGThinkerOptions",
    "KAGThinkerState",
    "LogicalForm",
    "ContentItem",
    "LogicalPlan",
    "LogicalFormParseError",
    "ArithmeticRefused",
    "FocusResult",
    "parse_logical_forms",
    "parse_focus",
    "parse_boundary_answer",
    "parse_confidence",
    "evaluate_arithmetic",
    "KAGThinker",
    "NODE_NAMES",
]
