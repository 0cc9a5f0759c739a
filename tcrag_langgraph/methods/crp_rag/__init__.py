"""CRP-RAG (crp-rag.md, section 3): a reasoning graph guides retrieval, knowledge evaluation and answering.

Three modules of the paper, as five LangGraph nodes:

* **GC, reasoning-graph construction** (``Expand``, looping on itself): from the question, every
  non-final sink gets up to ``fan_out`` sampled next steps (eq. 4, prompt A.1); the new steps of
  one iteration whose MiniLM embeddings have an inner product above ``merge_threshold`` are merged
  by the model (eqs. 5-6, prompt A.2) and the merged step inherits every parent. Construction
  stops when every sink is a final step, or at ``max_depth`` iterations / ``max_nodes`` nodes.
  Edges only go from one iteration's nodes to the next one's, so the graph is a DAG by
  construction (:func:`check_dag` asserts it).
* **KRA, knowledge retrieval and aggregation** (``Retrieve``): each node's text is searched with
  every tool through :func:`~tcrag_langgraph.tools.layer.invoke_tool` (a tool error is never
  evidence); the results are aggregated by the model (eq. 8, prompt A.3: common points, points
  unique to one result, conflicts judged and dropped).
* **AG, answer generation**: ``Evaluate`` asks the model to reason on each node with its knowledge
  (prompt A.4) and scores that reasoning's perplexity given the node and knowledge with the state
  monitor's scorer (``cppl``, eqs. 9-10): below ``sufficiency_threshold`` the node is sufficient.
  ``Select`` keeps the source-to-sink paths made only of sufficient nodes (at most ``max_paths``,
  lowest worst-node perplexity first) and **abstains** (``halt_reason="abstained"``, no answer)
  when there is none. ``Answer`` reasons along each path step by step (eqs. 11-12) and, for
  several paths, integrates their answers (eq. 13, prompt A.5); an answer that leaves the question
  open (``open_answer``, not in the paper) is answered once more from the question's own retrieval.

The reasoning graph is kept in the run state (``nodes``: plain dicts with ``id``, ``text``,
``depth``, ``parents``, ``final``, ``knowledge``, ``score``, ``sufficient`` ...) and streamed as
``tcrag`` events (``Reasoning_Node``, ``Merge_Nodes``, ``Node_Knowledge``, ``Sufficiency``,
``Reasoning_Path``, ``Path_Answer``, ``Open_Answer``, ``Halt``).

Example:
    >>> from tcrag_langgraph.testing import ScriptedScorer, recording_model, scripted_tool
    >>> model = recording_model(["Next step: Metformin is a biguanide.\\nFinal: yes",
    ...                          "Metformin is a biguanide.", "It is a biguanide.", "Answer: biguanide"])
    >>> graph = CRPRAG.build(model=model, tools=[scripted_tool("DOC_RAG", "Metformin: a biguanide.")],
    ...                      scorer=ScriptedScorer(default=2.0), options=CRPRAGOptions(fan_out=1))
    >>> out = graph.invoke({"question": "What class of drug is metformin?"})
    >>> out["answer"], out["halt_reason"], out["llm_calls"], out["tool_calls"]
    ('biguanide', 'answered', 4, 1)
"""

from __future__ import annotations

# The package's modules, one concern each: options, state, prompts, parsing (model output), dag (the
# reasoning graph's pure functions), calibration, construction (GC), knowledge (KRA +
# sufficiency), answering (path selection + answers) and graph (the node holder that names them).
from .calibration import sufficiency_model_id
from .dag import check_dag, select_paths
from .graph import CRPRAG, NODE_NAMES
from .options import CRPRAGOptions
from .parsing import ParsedStep, StepParseError, merged_step, parse_step
from .state import CRPState

__all__ = [
    "CRPRAGOptions",
    "CRPState",
    "ParsedStep",
    "StepParseError",
    "parse_step",
    "merged_step",
    "check_dag",
    "select_paths",
    "sufficiency_model_id",
    "CRPRAG",
    "NODE_NAMES",
]
