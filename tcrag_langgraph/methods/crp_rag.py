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
  several paths, integrates their answers (eq. 13, prompt A.5).

The reasoning graph is kept in the run state (``nodes``: plain dicts with ``id``, ``text``,
``depth``, ``parents``, ``final``, ``knowledge``, ``score``, ``sufficient`` ...) and streamed as
``tcrag`` events (``Reasoning_Node``, ``Merge_Nodes``, ``Node_Knowledge``, ``Sufficiency``,
``Reasoning_Path``, ``Path_Answer``, ``Halt``).

Example:
    >>> from tcrag_langgraph.testing import ScriptedScorer, recording_model, scripted_tool
    >>> model = recording_model(["Next step: Metformin is a biguanide.\\nFinal: yes",
    ...                          "Metformin is a biguanide.", "It is a biguanide.", "Answer: biguanide"])
    >>> graph = build_crp_rag_graph(model=model, tools=[scripted_tool("DOC_RAG", "Metformin: a biguanide.")],
    ...                             scorer=ScriptedScorer(default=2.0), options=CRPRAGOptions(fan_out=1))
    >>> out = graph.invoke({"question": "What class of drug is metformin?"})
    >>> out["answer"], out["halt_reason"], out["llm_calls"], out["tool_calls"]
    ('Answer: biguanide', 'answered', 4, 1)
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Mapping, Optional, Sequence, Union

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.runtime import Runtime
from langgraph.types import Command
from pydantic import BaseModel, ConfigDict, Field, field_validator
from typing_extensions import TypedDict

from .. import answer_format
from ..auth import caller_for_run
from ..config import CALLER_KEY, TCRAGConfig, resolve_config
from ..events import emit
# The stack machine's input and config handling, one home for every method of the package.
from ..run_input import child_config, extract_question, last_human_is
from ..prompting import message_text
from ..result import RunResult
from ..scoring import StateScorer, scorer_for_model
from ..state import TraceEvent
from ..tools.layer import invoke_tool, is_tool_error
from ..tools.tokens import count_tokens

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
    "calibrate_sufficiency",
    "build_crp_rag_graph",
    "NODE_NAMES",
]

NODE_NAMES = ("Start", "Expand", "Retrieve", "Evaluate", "Select", "Answer")
#: Longest reasoning-step text kept (a step is one sentence; a rambling sample is cut, not refused).
MAX_STEP_CHARS = 400


class CRPRAGOptions(BaseModel):
    """CRP-RAG's own bounds and thresholds (the shared generation settings stay in :class:`TCRAGConfig`).

    Every field can be overridden per run: ``graph.invoke(..., context=...)`` takes a CRPRAGOptions, a
    :class:`TCRAGConfig` or a mapping of either's fields (the two share no field name).

    Example:
        >>> CRPRAGOptions(fan_out=3).max_depth
        3
        >>> CRPRAGOptions(sufficiency_threshold="auto").sufficiency_threshold
        'auto'
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    fan_out: int = Field(default=2, ge=1, le=8, description="Sampled next steps per sink and iteration.")
    max_depth: int = Field(default=3, ge=1, le=8, description="Graph-construction iterations (longest path).")
    max_nodes: int = Field(default=12, ge=1, le=64, description="Nodes in the reasoning graph, at most.")
    merge_threshold: float = Field(default=0.85, gt=0.0, le=1.0,
                                   description="New steps whose MiniLM inner product is above this are merged.")
    sampling_temperature: float = Field(default=0.8, gt=0.0, le=2.0,
                                        description="Temperature of next-step sampling (LocalChatModel).")
    max_step_tokens: int = Field(default=96, ge=8, le=1024, description="New tokens of one step or merge.")
    sufficiency_threshold: Union[Annotated[float, Field(gt=0)], Literal["auto"]] = Field(
        default=10.0, description="A node is knowledge-sufficient when its reasoning's cppl is below this; "
        "'auto' = the stored calibration (calibrate_sufficiency) of the generator.")
    max_paths: int = Field(default=3, ge=1, le=16, description="Sufficient paths answered and integrated.")
    aggregate_knowledge: bool = Field(default=True, description="Aggregate retrieval results with the model "
                                      "(prompt A.3); False concatenates them (the paper's ablation).")
    max_step_retries: int = Field(default=1, ge=0, le=5, description="Re-prompts after an unusable step.")

    @field_validator("sufficiency_threshold", mode="before")
    @classmethod
    def _threshold(cls, value: Any) -> Any:
        if isinstance(value, bool):
            raise ValueError("sufficiency_threshold must be a number or 'auto'")
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if isinstance(value, (int, float)) and not math.isfinite(value):
            raise ValueError("sufficiency_threshold must be finite")
        return value

    def merged(self, overrides: "CRPRAGOptions | Mapping[str, Any] | None") -> "CRPRAGOptions":
        """A copy with the explicitly set fields of ``overrides`` applied (unknown keys are an error)."""
        if overrides is None:
            return self
        if isinstance(overrides, CRPRAGOptions):
            values = {name: getattr(overrides, name) for name in overrides.model_fields_set}
        elif isinstance(overrides, Mapping):
            values = dict(overrides)
        else:
            raise TypeError(f"CRP-RAG context must be CRPRAGOptions or a mapping, not {type(overrides).__name__}")
        return type(self).model_validate({**self.model_dump(), **values}) if values else self


class CRPState(TypedDict, total=False):
    """Graph state. Input is ``{"question": ...}`` or ``{"messages": [...]}``."""

    question: Optional[str]
    messages: Annotated[list[AnyMessage], add_messages]
    nodes: list[dict[str, Any]]  # the reasoning graph: one dict per node, edges as ``parents``
    depth: int
    threshold: float
    paths: list[list[int]]
    path_answers: list[str]
    structured_answer: Any  # the answer in TCRAGConfig.answer_format, when one was asked
    format_retries: int
    path_score: Optional[float]  # the best path's worst (highest) node perplexity: what calibration uses
    state_value: Optional[float]
    state_history: list[dict[str, Any]]
    answer: Optional[str]
    answer_validated: bool
    halt_reason: Optional[str]
    error: Optional[str]
    llm_calls: int
    tool_calls: int
    steps: int
    trace: list[TraceEvent]
    token_usage: dict[str, int]


# --------------------------------------------------------------------------------------------
# Prompts (paper appendix A; the reply formats are ours, so replies can be parsed). The appendix's
# "generated examples" are left out: Qwen2.5-Coder-0.5B copied a concrete example step verbatim
# into the graph and an example summary into a node's knowledge; forms use <placeholders> instead.
# --------------------------------------------------------------------------------------------

PROMPT_GENERATE = """Please propose the next reasoning step to answer the given question based on the provided conditions. Requirements:
1. The content of the next reasoning step must be grounded on the known conditions.
2. The content of the next reasoning step should be a sub-question or an explanation. The sub-question should be one that needs to be answered to address the given question based on the known conditions.
3. If the known conditions already lead to the answer, the next step is the final step: it states the answer.
Reply with exactly two lines:
Next step: <the next reasoning step, one sentence>
Final: <yes if this step states the answer to the question, otherwise no>

The question is: {question}
The known conditions are: {conditions}"""

PROMPT_MERGE = """Please merge the information from the multiple given text paragraphs to create a text summary that includes the complete content of all paragraphs. The requirements for the content are:
1. Summarize and abstract the information commonly mentioned in each paragraph.
2. Integrate and list the content uniquely mentioned in each paragraph.
3. Annotate any conflicting information mentioned across the paragraphs.
Reply with exactly one line:
Next step: <the merged reasoning step, one or two sentences>

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

STEP_FORMAT_HELP = "Reply with exactly two lines:\nNext step: <the next reasoning step, one sentence>\nFinal: <yes or no>"


# --------------------------------------------------------------------------------------------
# Parsing a sampled step: strict, typed, with repair; the caller re-prompts on StepParseError
# --------------------------------------------------------------------------------------------


class StepParseError(ValueError):
    """The model's reply holds no usable reasoning step."""


@dataclass(frozen=True)
class ParsedStep:
    """One reasoning step from a reply, whether it is final, and what had to be repaired."""

    text: str
    final: bool
    repairs: tuple[str, ...] = field(default_factory=tuple)


_STEP_LABEL = re.compile(r"^\s*(?:[*_#>-]+\s*)?(?:next\s+)?(?:reasoning\s+)?step(?:\s*\d+)?\s*(?:[*_]+\s*)?[:：]\s*(.*)$",
                         re.IGNORECASE)
_FINAL_LABEL = re.compile(r"^\s*(?:[*_#>-]+\s*)?final(?:\s+step)?\s*(?:[*_]+\s*)?[:：]\s*(.*)$", re.IGNORECASE)
_LIST_MARK = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+")


def parse_step(text: str) -> ParsedStep:
    """The step in a reply to prompt A.1 (``Next step: ...`` / ``Final: yes|no``).

    Repairs (listed in ``repairs``): a reply without the label uses its first line; a missing or
    unreadable ``Final:`` line means "not final"; a step longer than ``MAX_STEP_CHARS`` is cut.

    Example:
        >>> parse_step("Next step: Check the dose.\\nFinal: no")
        ParsedStep(text='Check the dose.', final=False, repairs=())
        >>> parse_step("1. The answer is B.\\nFinal: YES").repairs
        ('no Next step label: used the first line',)
        >>> parse_step("   ")
        Traceback (most recent call last):
        ...
        tcrag_langgraph.methods.crp_rag.StepParseError: the reply is empty
    """
    if not isinstance(text, str) or not text.strip():
        raise StepParseError("the reply is empty")
    repairs: list[str] = []
    lines = [line for line in text.splitlines() if line.strip()]
    step: Optional[str] = None
    final: Optional[bool] = None
    for i, line in enumerate(lines):
        found_final = _FINAL_LABEL.match(line)
        if found_final:
            if final is None:
                word = found_final.group(1).strip(" \t*_.").lower()
                final = True if word in ("yes", "true") else False if word in ("no", "false") else None
                if final is None:
                    repairs.append(f"unreadable Final value {word[:20]!r}: taken as no")
                    final = False
            continue
        found_step = _STEP_LABEL.match(line)
        if found_step and step is None:
            step = found_step.group(1).strip()
            if not step and i + 1 < len(lines) and not _FINAL_LABEL.match(lines[i + 1]):
                step = lines[i + 1].strip()
    if step is None:
        first = next((line for line in lines if not _FINAL_LABEL.match(line)), "")
        step = _LIST_MARK.sub("", first).strip()
        repairs.append("no Next step label: used the first line")
    step = step.strip().strip("*_").strip()
    if sum(ch.isalpha() for ch in step) < 3:  # "...", "2": no step (seen from SmolLM2)
        raise StepParseError("no reasoning step after 'Next step:'")
    if len(step) > MAX_STEP_CHARS:
        step = step[:MAX_STEP_CHARS].rstrip() + "…"
        repairs.append(f"step cut to {MAX_STEP_CHARS} characters")
    if final is None:
        repairs.append("no Final line: taken as no")
        final = False
    return ParsedStep(text=step, final=final, repairs=tuple(repairs))


def merged_step(text: str) -> Optional[str]:
    """The step of a merge reply (prompt A.2): its ``Next step:`` line, or ``None`` when it has none.

    Unlike :func:`parse_step` there is no first-line repair: a merge reply without the label is
    usually a preamble ("To summarize ... as follows:", seen from Qwen2.5-Coder-0.5B), and the caller
    keeps the original step instead.

    Example:
        >>> merged_step("Sure.\\nNext step: Find metformin's drug class.")
        "Find metformin's drug class."
        >>> merged_step("To summarize the paragraphs, we can write:") is None
        True
    """
    for line in (text or "").splitlines():
        found = _STEP_LABEL.match(line)
        if found:
            step = found.group(1).strip().strip("*_").strip()
            if sum(ch.isalpha() for ch in step) >= 3:
                return step[:MAX_STEP_CHARS].rstrip()
    return None


# --------------------------------------------------------------------------------------------
# The reasoning graph: invariants and path selection (pure functions over the node dicts)
# --------------------------------------------------------------------------------------------


def check_dag(nodes: Sequence[Mapping[str, Any]]) -> None:
    """Raise ValueError unless ``nodes`` is a DAG: unique ids, known parents, every edge going
    from a lower depth to the next depth (which rules out cycles), roots at depth 1.

    Example:
        >>> check_dag([{"id": 0, "depth": 1, "parents": []}, {"id": 1, "depth": 2, "parents": [0]}])
        >>> check_dag([{"id": 0, "depth": 1, "parents": [0]}])
        Traceback (most recent call last):
        ...
        ValueError: node 0 at depth 1 has parent 0 at depth 1 (edges go one depth down)
    """
    by_id = {n["id"]: n for n in nodes}
    if len(by_id) != len(nodes):
        raise ValueError("node ids are not unique")
    for node in nodes:
        if not node["parents"] and node["depth"] != 1:
            raise ValueError(f"node {node['id']} has no parent but depth {node['depth']}")
        for parent in node["parents"]:
            if parent not in by_id:
                raise ValueError(f"node {node['id']} has unknown parent {parent}")
            if by_id[parent]["depth"] != node["depth"] - 1:
                raise ValueError(f"node {node['id']} at depth {node['depth']} has parent {parent} at depth "
                                 f"{by_id[parent]['depth']} (edges go one depth down)")


def _children(nodes: Sequence[Mapping[str, Any]]) -> dict[int, list[int]]:
    children: dict[int, list[int]] = {n["id"]: [] for n in nodes}
    for node in nodes:
        for parent in node["parents"]:
            children[parent].append(node["id"])
    return children


def select_paths(nodes: Sequence[Mapping[str, Any]], *, max_paths: int) -> list[list[int]]:
    """Source-to-sink paths whose every node is sufficient, best first, at most ``max_paths``.

    A path's cost is its worst node perplexity (``score``); ties go to the shorter path, then to
    lower node ids, so the choice never depends on dict or set order.

    Example:
        >>> g = [{"id": 0, "depth": 1, "parents": [], "sufficient": True, "score": 3.0},
        ...      {"id": 1, "depth": 2, "parents": [0], "sufficient": True, "score": 2.0},
        ...      {"id": 2, "depth": 2, "parents": [0], "sufficient": False, "score": 30.0}]
        >>> select_paths(g, max_paths=3)
        [[0, 1]]
    """
    if max_paths < 1:
        raise ValueError("max_paths must be >= 1")
    by_id = {n["id"]: n for n in nodes}
    children = _children(nodes)
    found: list[list[int]] = []

    def walk(path: list[int]) -> None:
        # Paths are at most max_depth long and nodes at most max_nodes: the walk is bounded.
        kids = children[path[-1]]
        if not kids:
            found.append(list(path))
            return
        for kid in kids:
            if by_id[kid].get("sufficient"):
                walk([*path, kid])

    for node in nodes:
        if not node["parents"] and node.get("sufficient"):
            walk([node["id"]])
    found.sort(key=lambda p: (max(by_id[i]["score"] for i in p), len(p), p))
    return found[:max_paths]


def _best_path_score(nodes: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """The lowest worst-node perplexity over all source-to-sink paths, sufficient or not (what a
    threshold is calibrated on: the question is answered exactly when this is below it)."""
    if not nodes:
        return None
    scored = [{**n, "sufficient": n.get("score") is not None} for n in nodes]
    best = select_paths(scored, max_paths=1)
    if not best:
        return None
    by_id = {n["id"]: n for n in nodes}
    return max(float(by_id[i]["score"]) for i in best[0])


# --------------------------------------------------------------------------------------------
# Calibration of the sufficiency threshold (like sigma)
# --------------------------------------------------------------------------------------------


def sufficiency_model_id(model: Any) -> str:
    """The id a generator's sufficiency calibration is stored under (``<chat_model_id>+crp-rag``)."""
    from ..models import chat_model_id

    return f"{chat_model_id(model)}+crp-rag"


def calibrate_sufficiency(
    path_scores: Sequence[Optional[float]], correct: Sequence[bool], *, model: Any, dataset: str,
    rule: Literal["youden", "accuracy"] = "youden",
):
    """A :class:`~tcrag_langgraph.eval.calibration.Calibration` of ``sufficiency_threshold``.

    ``path_scores`` are the runs' ``path_score`` (also the eval rows' ``state_value``) from a dev
    split run with a threshold high enough never to abstain; ``correct`` whether each answer was
    right. A question is answered exactly when its path score is below the threshold, so this is
    the same decision sigma makes, chosen by the same rule. Save it with
    :func:`~tcrag_langgraph.eval.calibration.save_calibration`; ``sufficiency_threshold="auto"``
    then reads it for the same generator.
    """
    from ..eval.calibration import Calibration, calibrate

    result = calibrate(path_scores, correct, rule=rule)
    return Calibration(metric="cppl", sigma=result.sigma, auroc=result.auroc, model_id=sufficiency_model_id(model),
                       dataset=dataset, n=result.n, details={"rule": rule, "method": "crp-rag",
                                                             "quantity": "path_score"})


def _resolve_threshold(options: CRPRAGOptions, model: Any) -> float:
    if options.sufficiency_threshold == "auto":
        from ..eval.calibration import CalibrationNotFoundError, default_calibration_path, load_calibration

        model_id = sufficiency_model_id(model)
        try:
            return float(load_calibration(model_id=model_id, metric="cppl").sigma)
        except CalibrationNotFoundError:  # its hint names `tcrag calibrate`, which calibrates sigma, not this
            raise ValueError(
                f"no stored sufficiency calibration for {model_id!r} at {default_calibration_path(model_id, 'cppl')}: "
                "make one with calibrate_sufficiency(...) and save_calibration(...), or give "
                "sufficiency_threshold as a number") from None
    return float(options.sufficiency_threshold)


# --------------------------------------------------------------------------------------------
# The graph
# --------------------------------------------------------------------------------------------


class _RunFailure(Exception):
    """A model or scorer failure that ends the run with ``halt_reason``."""

    def __init__(self, reason: str, exc: BaseException) -> None:
        super().__init__(f"{type(exc).__name__}: {exc}")
        self.reason = reason


class _CRPRAG:
    """Holds the model, tools, scorer and embedder; its methods are the graph nodes."""

    def __init__(self, model: BaseChatModel, tools: Sequence[BaseTool], scorer: Any, embeddings: Any,
                 config: TCRAGConfig, options: CRPRAGOptions) -> None:
        self.model = model
        self.tools = list(tools)
        self.scorer = scorer
        self.embeddings = embeddings
        self.config = config
        self.options = options

    # ----- helpers -----
    def settings(self, config: RunnableConfig, runtime: Runtime) -> tuple[CRPRAGOptions, TCRAGConfig]:
        """This run's options and shared config: ``context=`` may be CRPRAGOptions, TCRAGConfig or a
        mapping of either's fields; ``configurable`` may set TCRAGConfig fields (as for TC-RAG)."""
        context = getattr(runtime, "context", None)
        own: Any = None
        shared: Any = None
        if isinstance(context, CRPRAGOptions):
            own = context
        elif isinstance(context, TCRAGConfig):
            shared = context
        elif isinstance(context, Mapping):
            unknown = sorted(set(context) - set(CRPRAGOptions.model_fields) - set(TCRAGConfig.model_fields))
            if unknown:
                raise ValueError(f"unknown options {unknown}")
            own = {k: v for k, v in context.items() if k in CRPRAGOptions.model_fields}
            shared = {k: v for k, v in context.items() if k in TCRAGConfig.model_fields}
        elif context is not None:
            raise ValueError(f"context must be CRPRAGOptions, TCRAGConfig or a mapping, not {type(context).__name__}")
        return self.options.merged(own), resolve_config(self.config, configurable=(config or {}).get("configurable"),
                                                        context=shared)

    @staticmethod
    def record(config: RunnableConfig, events: list[TraceEvent], *, step: int,
               action: str, op: str, content: str = "", nodes: int = 0, value: Optional[float] = None,
               detail: Optional[dict[str, Any]] = None) -> None:
        event = TraceEvent(step=step, action=action, op=op, content=content[:2000], stack_depth=nodes,
                           state_value=value,
                           detail=None if detail is None else json.dumps(detail, ensure_ascii=False, default=str))
        emit(event, config)
        events.append(event)

    def ask(self, counters: dict[str, Any], messages: list[BaseMessage], config: RunnableConfig, *,
            max_new_tokens: int, temperature: float) -> str:
        """One model call (counted, tokens metered); a failure becomes a ``model_error`` halt."""
        from ..models import LocalChatModel

        kwargs: dict[str, Any] = {}
        if isinstance(self.model, LocalChatModel):  # only our model takes these per call
            kwargs.update(max_new_tokens=max_new_tokens, temperature=temperature)
        counters["llm_calls"] += 1
        counters["prompt"] += sum(count_tokens(message_text(m.content)) for m in messages)
        try:
            reply = self.model.invoke(messages, config=child_config(config), **kwargs)
        except Exception as exc:
            raise _RunFailure("model_error", exc) from exc
        text = message_text(reply.content).strip()
        counters["completion"] += count_tokens(text)
        return text

    def score(self, context: str, text: str) -> float:
        try:
            if hasattr(self.scorer, "score"):
                value = float(self.scorer.score(context, text, metric="cppl"))
            else:
                value = float(self.scorer(context, text, metric="cppl"))
        except Exception as exc:
            raise _RunFailure("scorer_error", exc) from exc
        if not math.isfinite(value):
            raise _RunFailure("scorer_error", ValueError(f"the scorer returned {value}"))
        return value

    @staticmethod
    def counters(state: Mapping[str, Any]) -> dict[str, Any]:
        usage = state.get("token_usage") or {}
        return {"llm_calls": state.get("llm_calls", 0), "tool_calls": state.get("tool_calls", 0),
                "prompt": usage.get("prompt", 0), "completion": usage.get("completion", 0),
                "steps": state.get("steps", 0)}

    @staticmethod
    def totals(counters: Mapping[str, Any]) -> dict[str, Any]:
        return {"llm_calls": counters["llm_calls"], "tool_calls": counters["tool_calls"], "steps": counters["steps"],
                "token_usage": {"prompt": counters["prompt"], "completion": counters["completion"]}}

    def halt(self, state: Mapping[str, Any], config: RunnableConfig, counters: dict[str, Any],
             events: list[TraceEvent], *, reason: str, answer: Optional[str] = None, validated: bool = False,
             error: Optional[str] = None, extra: Optional[dict[str, Any]] = None) -> Command:
        nodes = (extra or {}).get("nodes", state.get("nodes") or [])
        self.record(config, events, step=counters["steps"], action="Halt", op="halt", content=answer or "",
                    nodes=len(nodes), value=(extra or {}).get("path_score", state.get("path_score")),
                    detail={"halt_reason": reason, "error": error})
        update: dict[str, Any] = {**(extra or {}), **self.totals(counters),
                                  "trace": [*state.get("trace", []), *events], "answer": answer,
                                  "answer_validated": validated, "halt_reason": reason, "error": error}
        result = RunResult.from_state({**state, **update})
        update["messages"] = [AIMessage(content=result.text, response_metadata=result.metadata())]
        return Command(goto=END, update=update)

    # ----- Start -----
    def start(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["Expand", "__end__"]]:
        base: dict[str, Any] = {
            "nodes": [], "depth": 0, "paths": [], "path_answers": [], "path_score": None, "state_value": None,
            "structured_answer": None, "format_retries": 0,
            "state_history": [], "answer": None, "answer_validated": False, "halt_reason": None, "error": None,
            "llm_calls": 0, "tool_calls": 0, "steps": 0, "trace": [], "token_usage": {"prompt": 0, "completion": 0},
        }
        counters = self.counters(base)
        events: list[TraceEvent] = []
        question, problem = extract_question(state, self.config)
        try:
            options, cfg = self.settings(config, runtime)
            threshold = _resolve_threshold(options, self.model)
            if problem is None:  # the run's own length limit
                question, problem = extract_question(state, cfg)
        except Exception as exc:  # a bad per-run context or a missing calibration: say so, lose nothing
            problem = problem or f"bad CRP-RAG options: {exc}"
            threshold = None
        if problem is not None:
            return self.halt({**state, **base}, config, counters, events, reason="invalid_input", error=problem,
                             extra={**base, "question": None})
        update = {**base, "question": question, "threshold": threshold}
        if not last_human_is(state, question):
            update["messages"] = [HumanMessage(content=question)]
        return Command(goto="Expand", update=update)

    # ----- GC: one construction iteration -----
    def expand(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Expand", "Retrieve", "__end__"]
    ]:
        options, cfg = self.settings(config, runtime)
        counters = self.counters(state)
        events: list[TraceEvent] = []
        question = state["question"]
        nodes = [dict(n) for n in state.get("nodes", [])]
        depth = state.get("depth", 0) + 1
        by_id = {n["id"]: n for n in nodes}
        # Sinks to grow: the question itself at first, then every non-final sink not yet expanded.
        sinks: list[Optional[dict[str, Any]]] = [None] if not nodes else [
            n for n in nodes if not n["final"] and not n["expanded"]]
        samples: list[tuple[Optional[int], ParsedStep]] = []
        room = options.max_nodes - len(nodes)
        try:
            for sink in sinks:
                conditions = _conditions(sink, by_id)
                for _ in range(options.fan_out):
                    if len(samples) >= room:
                        break
                    parsed = self.sample_step(question, conditions, options, config, counters, events, len(nodes))
                    if parsed is not None:
                        samples.append((None if sink is None else sink["id"], parsed))
                if sink is not None:
                    sink["expanded"] = True
            new_nodes = self.merge(question, samples, options, cfg, config, counters, events,
                                   start_id=len(nodes), depth=depth)
        except _RunFailure as failure:
            return self.halt(state, config, counters, events, reason=failure.reason, error=str(failure),
                             extra={"nodes": nodes, "depth": depth})
        for node in new_nodes:
            nodes.append(node)
            counters["steps"] += 1
            self.record(config, events, step=counters["steps"], action="Reasoning_Node", op="push",
                        content=node["text"], nodes=len(nodes),
                        detail={"id": node["id"], "parents": node["parents"], "depth": depth, "final": node["final"]})
        check_dag(nodes)
        update = {"nodes": nodes, "depth": depth, **self.totals(counters), "trace": [*state.get("trace", []), *events]}
        if not nodes:
            return self.halt(state, config, counters, events, reason="format_error",
                             error="no usable reasoning step was generated", extra={"nodes": nodes, "depth": depth})
        open_sinks = [n for n in nodes if not n["final"] and not n["expanded"]]
        if open_sinks and depth < options.max_depth and len(nodes) < options.max_nodes:
            return Command(goto="Expand", update=update)
        return Command(goto="Retrieve", update=update)

    def sample_step(self, question: str, conditions: str, options: CRPRAGOptions, config: RunnableConfig,
                    counters: dict[str, Any], events: list[TraceEvent], n_nodes: int) -> Optional[ParsedStep]:
        """One sampled next step (eq. 4), re-prompted on an unusable reply; ``None`` if none came."""
        messages: list[BaseMessage] = [HumanMessage(content=PROMPT_GENERATE.format(question=question,
                                                                                   conditions=conditions))]
        for attempt in range(options.max_step_retries + 1):
            text = self.ask(counters, messages, config, max_new_tokens=options.max_step_tokens,
                            temperature=options.sampling_temperature)
            try:
                return parse_step(text)
            except StepParseError as err:
                self.record(config, events, step=counters["steps"], action="Format_Error", op="format_error",
                            content=text[:500], nodes=n_nodes, detail={"error": str(err), "attempt": attempt + 1})
                messages = [*messages, AIMessage(content=text or "(empty)"),
                            HumanMessage(content=f"Your reply could not be used: {err}.\n{STEP_FORMAT_HELP}")]
        return None

    def merge(self, question: str, samples: list[tuple[Optional[int], ParsedStep]], options: CRPRAGOptions,
              cfg: TCRAGConfig, config: RunnableConfig, counters: dict[str, Any], events: list[TraceEvent], *, start_id: int,
              depth: int) -> list[dict[str, Any]]:
        """Merge this iteration's near-duplicate steps (eqs. 5-6) into new node dicts.

        Each sample is compared, in order, with the groups formed so far; above the threshold it
        joins the most similar group (ties: the earliest), whose text the model rewrites from both.
        Identical texts merge without a model call. At most one merge per sample: bounded.
        """
        if not samples:
            return []
        groups: list[dict[str, Any]] = []
        vectors: list[Any] = []
        # One sample has nothing to merge with: the embedder is not even loaded.
        sample_vectors = self.embed([p.text for _, p in samples]) if len(samples) > 1 else [None]
        for (parent, parsed), vector in zip(samples, sample_vectors):
            best, best_sim = None, -1.0
            for index, group_vector in enumerate(vectors):
                similarity = float(group_vector @ vector)
                if similarity > best_sim:
                    best, best_sim = index, similarity
            if best is None or best_sim <= options.merge_threshold:
                groups.append({"text": parsed.text, "final": parsed.final, "parents": [] if parent is None else [parent],
                               "members": [parsed.text]})
                vectors.append(vector)
                continue
            group = groups[best]
            before = group["text"]
            repair = None
            if _normal(parsed.text) != _normal(before):
                merged = self.ask(counters, [HumanMessage(content=PROMPT_MERGE.format(
                    question=question, paragraphs=f"1. {before}\n2. {parsed.text}"))], config,
                    max_new_tokens=options.max_step_tokens, temperature=cfg.temperature)
                merged_text = merged_step(merged)
                if merged_text is None:  # no labelled step (e.g. only a preamble): keep the first step
                    repair = "no 'Next step:' line in the merge reply: kept the first step"
                else:
                    group["text"] = merged_text
                    vectors[best] = self.embed([group["text"]])[0]
            group["final"] = group["final"] or parsed.final
            if parent is not None and parent not in group["parents"]:
                group["parents"].append(parent)
            group["members"].append(parsed.text)
            self.record(config, events, step=counters["steps"], action="Merge_Nodes", op="pop+push",
                        content=group["text"], nodes=start_id + len(groups), value=best_sim,
                        detail={"merged": [before, parsed.text], "similarity": round(best_sim, 4),
                                "parents": group["parents"], "repair": repair})
        return [{"id": start_id + i, "text": g["text"], "depth": depth, "parents": sorted(g["parents"]),
                 "final": bool(g["final"]), "expanded": False, "merged_from": g["members"] if len(g["members"]) > 1
                 else [], "knowledge": None, "evidence": [], "reasoning": None, "score": None, "sufficient": None}
                for i, g in enumerate(groups)]

    def embed(self, texts: list[str]):
        from ..tools.documents import embed_texts

        return embed_texts(self.embeddings, texts)

    # ----- KRA -----
    def retrieve(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Evaluate", "__end__"]
    ]:
        options, cfg = self.settings(config, runtime)
        counters = self.counters(state)
        events: list[TraceEvent] = []
        nodes = [dict(n) for n in state["nodes"]]
        child = child_config(config)
        # The authenticated server user, else the trusted config's caller; never the client's words.
        child["configurable"] = {**child.get("configurable", {}), CALLER_KEY: caller_for_run(config, base=cfg.caller)}
        try:
            for node in nodes:
                results: list[tuple[str, str]] = []
                failures: list[str] = []
                for tool in self.tools:
                    outcome = invoke_tool(tool, node["text"], config=child, timeout_s=cfg.tool_timeout_s,
                                          max_output_tokens=cfg.max_observation_tokens)
                    counters["tool_calls"] += 1
                    if is_tool_error(outcome):
                        failures.append(f"{tool.name}: {outcome.kind}")
                    elif outcome.strip():
                        results.append((tool.name, outcome.strip()))
                node["evidence"] = [name for name, _ in results]
                listing = "\n".join(f"[{i}] ({name}) {text}" for i, (name, text) in enumerate(results, 1))
                if not results:
                    node["knowledge"] = ""
                elif options.aggregate_knowledge:
                    node["knowledge"] = self.ask(
                        counters, [HumanMessage(content=PROMPT_AGGREGATE.format(step=node["text"], results=listing))],
                        config, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
                else:
                    node["knowledge"] = listing
                counters["steps"] += 1
                self.record(config, events, step=counters["steps"], action="Node_Knowledge", op="push",
                            content=node["knowledge"], nodes=len(nodes),
                            detail={"id": node["id"], "tools": node["evidence"], "tool_errors": failures})
        except _RunFailure as failure:
            return self.halt(state, config, counters, events, reason=failure.reason, error=str(failure),
                             extra={"nodes": nodes})
        return Command(goto="Evaluate", update={"nodes": nodes, **self.totals(counters),
                                                "trace": [*state.get("trace", []), *events]})

    # ----- AG: knowledge sufficiency -----
    def evaluate(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Select", "__end__"]
    ]:
        counters = self.counters(state)
        events: list[TraceEvent] = []
        nodes = [dict(n) for n in state["nodes"]]
        threshold = state["threshold"]
        _, cfg = self.settings(config, runtime)
        try:
            for node in nodes:
                counters["steps"] += 1
                if not node["knowledge"]:  # nothing retrieved: no knowledge can be sufficient
                    node.update(reasoning=None, score=None, sufficient=False)
                    self.record(config, events, step=counters["steps"], action="Sufficiency", op="reject",
                                content=node["text"], nodes=len(nodes),
                                detail={"id": node["id"], "sufficient": False, "why": "no evidence retrieved"})
                    continue
                prompt = PROMPT_REASON.format(step=node["text"], knowledge=node["knowledge"])
                reasoning = self.ask(counters, [HumanMessage(content=prompt)], config,
                                     max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
                if not reasoning:
                    score, why = None, "empty reasoning"
                else:
                    score, why = self.score(prompt, reasoning), None
                sufficient = score is not None and score < threshold
                node.update(reasoning=reasoning, score=score, sufficient=sufficient)
                self.record(config, events, step=counters["steps"], action="Sufficiency",
                            op="noop" if sufficient else "reject", content=reasoning, nodes=len(nodes), value=score,
                            detail={"id": node["id"], "sufficient": sufficient, "threshold": threshold, "why": why})
        except _RunFailure as failure:
            return self.halt(state, config, counters, events, reason=failure.reason, error=str(failure),
                             extra={"nodes": nodes})
        return Command(goto="Select", update={"nodes": nodes, **self.totals(counters),
                                              "trace": [*state.get("trace", []), *events]})

    # ----- AG: path selection -----
    def select(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Answer", "__end__"]
    ]:
        options, cfg = self.settings(config, runtime)
        counters = self.counters(state)
        events: list[TraceEvent] = []
        nodes = state["nodes"]
        paths = select_paths(nodes, max_paths=options.max_paths)
        best = _best_path_score(nodes)
        history = [*state.get("state_history", []), {"step": counters["steps"], "action": "Select", "value": best,
                                                    "raw": best}]
        extra = {"paths": paths, "path_score": best, "state_value": best, "state_history": history}
        if not paths:
            insufficient = [n["id"] for n in nodes if not n.get("sufficient")]
            return self.halt(state, config, counters, events, reason="abstained",
                             error=f"no source-to-sink path of knowledge-sufficient nodes (threshold "
                                   f"{state['threshold']:g}; insufficient nodes {insufficient})", extra=extra)
        for path in paths:
            counters["steps"] += 1
            self.record(config, events, step=counters["steps"], action="Reasoning_Path", op="push",
                        content=" -> ".join(_node(nodes, i)["text"] for i in path), nodes=len(nodes),
                        value=max(_node(nodes, i)["score"] for i in path), detail={"path": path})
        return Command(goto="Answer", update={**extra, **self.totals(counters),
                                              "trace": [*state.get("trace", []), *events]})

    # ----- AG: answers along the paths, integrated -----
    def answer(self, state: CRPState, config: RunnableConfig, runtime: Runtime) -> Command[Literal["__end__"]]:
        from ..eval.methods import _final_answer  # one home: the part after the last "Answer:" line

        counters = self.counters(state)
        events: list[TraceEvent] = []
        nodes = state["nodes"]
        question = state["question"]
        _, cfg = self.settings(config, runtime)
        fmt = cfg.answer_format
        rule = answer_format.instructions(fmt)
        rule_note = f" The line after 'Answer:' is your Conclusion. {rule}" if rule else ""
        answers: list[str] = []
        final_messages: list[BaseMessage] = []
        retries = 0
        try:
            for path in state["paths"]:
                conditions: list[str] = []
                result = ""
                for position, node_id in enumerate(path):
                    node = _node(nodes, node_id)
                    last = position == len(path) - 1
                    prompt = PROMPT_PATH_STEP.format(question=question, conditions="\n".join(conditions) or "(none yet)",
                                                     step=node["text"], knowledge=node["knowledge"],
                                                     last=LAST_STEP_NOTE + rule_note if last else "")
                    final_messages = [HumanMessage(content=prompt)]
                    result = self.ask(counters, final_messages, config,
                                      max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
                    conditions.append(f"{node['text']} {result}".strip())  # eq. 12: condition_n + result_n
                answers.append(result)
                counters["steps"] += 1
                self.record(config, events, step=counters["steps"], action="Path_Answer", op="push",
                            content=result, nodes=len(nodes), detail={"path": path})
            if len(answers) == 1:
                text = answers[0]
            else:
                listing = "\n".join(f"{i}. {a}" for i, a in enumerate(answers, 1))
                final_messages = [HumanMessage(content=PROMPT_INTEGRATE.format(question=question, answers=listing)
                                               + rule_note)]
                text = self.ask(counters, final_messages, config, max_new_tokens=cfg.max_new_tokens,
                                temperature=cfg.temperature)
            final = _final_answer(text)
            structured, problem = answer_format.check(fmt, final)
            # Bounded: at most max_format_retries re-prompts when the answer does not fit the asked format.
            while fmt is not None and problem is not None and retries < cfg.max_format_retries:
                retries += 1
                final_messages = [*final_messages, AIMessage(content=text or "(empty)"),
                                  HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
                text = self.ask(counters, final_messages, config, max_new_tokens=cfg.max_new_tokens,
                                temperature=cfg.temperature)
                final = _final_answer(text)
                structured, problem = answer_format.check(fmt, final)
        except _RunFailure as failure:
            return self.halt(state, config, counters, events, reason=failure.reason, error=str(failure),
                             extra={"path_answers": answers})
        extra = {"path_answers": answers, "format_retries": retries,
                 "structured_answer": structured if fmt is not None and problem is None else None}
        if not final:
            return self.halt(state, config, counters, events, reason="format_error", error="the final answer is empty",
                             extra=extra)
        if problem is not None:
            return self.halt(state, config, counters, events, reason="format_error", answer=final,
                             error=f"no answer in the asked format after {retries} re-prompts: {problem}", extra=extra)
        return self.halt(state, config, counters, events, reason="answered", answer=final, validated=True,
                         extra=extra)


def _node(nodes: Sequence[Mapping[str, Any]], node_id: int) -> Mapping[str, Any]:
    return next(n for n in nodes if n["id"] == node_id)


def _conditions(sink: Optional[Mapping[str, Any]], by_id: Mapping[int, Mapping[str, Any]]) -> str:
    """The known conditions of a sink: its ancestors (shallowest first) and itself."""
    if sink is None:
        return "(none yet)"
    seen: dict[int, Mapping[str, Any]] = {}
    todo = [sink["id"]]
    while todo:  # the graph is a DAG with at most max_nodes nodes: bounded
        current = by_id[todo.pop()]
        if current["id"] in seen:
            continue
        seen[current["id"]] = current
        todo.extend(current["parents"])
    ordered = sorted(seen.values(), key=lambda n: (n["depth"], n["id"]))
    return "\n".join(f"- {n['text']}" for n in ordered)


def _normal(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def build_crp_rag_graph(
    *,
    model: BaseChatModel,
    tools: Sequence[BaseTool] = (),
    scorer: Optional[StateScorer | Callable[..., float]] = None,
    config: Optional[TCRAGConfig] = None,
    options: Optional[CRPRAGOptions | Mapping[str, Any]] = None,
    embeddings: Any = None,
    checkpointer: Any = None,
    name: str = "crp-rag",
):
    """Build and compile the CRP-RAG graph.

    Args:
        model: any LangChain chat model (generator of steps, merges, knowledge, reasoning, answers).
        tools: LangChain tools; each node's text is searched with every one (names must be unique).
        scorer: the perplexity scorer for knowledge sufficiency (``score(context, text, *, metric)``);
            ``None`` scores with the generator's own weights (:func:`~tcrag_langgraph.scoring.scorer_for_model`),
            which raises :class:`~tcrag_langgraph.scoring.MonitorUnavailableError` for models without
            trusted log-probs (then pass one: sufficiency is the method's core, it cannot be off).
        config: the shared :class:`TCRAGConfig` (``max_new_tokens``, ``temperature``, tool timeout and
            observation budget, question length limit, ``caller``).
        options: :class:`CRPRAGOptions` (or a dict of its fields); per run: ``context=``.
        embeddings: the embedder for node merging (default: the packaged MiniLM).
        checkpointer: a LangGraph checkpointer; the state holds only plain dicts, lists and
            TraceEvents, so ``serde=tcrag_langgraph.integration.checkpoint_serde()`` restores it.

    Returns:
        A compiled graph: ``invoke({"question": ...})`` or ``invoke({"messages": [...]})``.
    """
    if not isinstance(model, BaseChatModel):
        raise TypeError(f"model must be a LangChain chat model, got {type(model).__name__}")
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    opts = options if isinstance(options, CRPRAGOptions) else CRPRAGOptions.model_validate(dict(options or {}))
    tools = list(tools)
    for tool in tools:
        if not isinstance(tool, BaseTool):
            raise TypeError(f"tools must be LangChain BaseTool instances, got {type(tool).__name__}")
    if len({tool.name for tool in tools}) != len(tools):
        raise ValueError("tool names must be unique")
    if scorer is None:
        scorer = scorer_for_model(model)
    elif not (hasattr(scorer, "score") or callable(scorer)):
        raise TypeError("scorer must have score(query, text, *, metric) or be callable")
    if embeddings is None:
        from ..tools.documents import default_embeddings

        embeddings = default_embeddings()
    machine = _CRPRAG(model, tools, scorer, embeddings, cfg, opts)
    builder = StateGraph(CRPState)  # context: CRPRAGOptions, TCRAGConfig or a mapping (see settings)
    builder.add_node("Start", machine.start)
    builder.add_node("Expand", machine.expand)
    builder.add_node("Retrieve", machine.retrieve)
    builder.add_node("Evaluate", machine.evaluate)
    builder.add_node("Select", machine.select)
    builder.add_node("Answer", machine.answer)
    builder.add_edge(START, "Start")
    return builder.compile(checkpointer=checkpointer, name=name)
