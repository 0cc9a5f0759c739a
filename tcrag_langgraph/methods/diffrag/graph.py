"""The TCM-DiffRAG LangGraph graph (:func:`build_diffrag_graph`): Start -> Reasoning_Path -> Recall ->
Answer, each node a closure over the run's model, options and lazily built knowledge."""

from __future__ import annotations

import json
import threading
from typing import Any, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import END, START, StateGraph
from langgraph.runtime import Runtime

from ...machine import answer_format
from ...machine.config import TCRAGConfig, resolve_config
from ...machine.events import emit
from ...tools.layer.outcome import content_text
from ...machine.run_input import child_config, extract_question, last_human_is
from ...machine.state import TraceEvent
from ...tools.chunking import Document
from ...tools.tokens import count_tokens
from .building import default_knowledge
from .extraction import ExtractionCalls, extract_triples, generation_kwargs
from .knowledge import DiffRAGKnowledge, SolvedCase
from .options import DiffRAGOptions, max_new_tokens_for
from .parsing import MAX_PART_CHARS, UNKNOWN, Triple, final_answer
from .prompts import ANSWER_SYSTEM, PATH_SYSTEM
from .retrieval import RecalledTriple, evidence_text, recall
from .state import DiffRAGState, add_token_usage


def build_diffrag_graph(
    *,
    model: Any = None,
    tools: Sequence[BaseTool] = (),
    scorer: Any = None,
    config: Optional[TCRAGConfig] = None,
    options: Optional[DiffRAGOptions | Mapping[str, Any]] = None,
    knowledge: Optional[DiffRAGKnowledge] = None,
    documents: Optional[Sequence[Document]] = None,
    cases: Sequence[SolvedCase | Mapping[str, Any]] = (),
    general_kg: Any = "packaged",
    embeddings: Any = None,
    model_id: Optional[str] = None,
    checkpointer: Any = None,
    name: str = "diffrag",
):
    """Compile the TCM-DiffRAG graph: Start -> Reasoning_Path -> Recall -> Answer.

    Args:
        model: chat model (object, path, ``.gguf`` or ``"provider:model"``; None: packaged SmolLM2).
        tools: accepted for parity with the other methods; TCM-DiffRAG retrieves from its own graph
            and calls no tool.
        scorer: unused (the method has no state monitor); accepted for the eval harness.
        config: generation settings (``max_new_tokens``, ``max_question_chars``).
        options: :class:`DiffRAGOptions` (or a mapping of its fields).
        knowledge: a prebuilt :class:`DiffRAGKnowledge`; None builds one lazily on the first run from
            ``documents`` (default: the first packaged PubMedQA abstracts) and ``cases``, cached on disk.
        general_kg: the packaged HPO graph (``"packaged"``, loaded on first use), a
            :class:`~tcrag_langgraph.tools.knowledge_graph.KnowledgeGraph`, or None (off).
        embeddings: the embedder for triple matching (default: packaged MiniLM).
        model_id: the model's name in the on-disk cache key (default: ``chat_model_id(model)``; a model
            without a name is not cached on disk).
        checkpointer: any LangGraph checkpointer.
    """
    from ...models.local import resolve_chat_model

    base_options = options if isinstance(options, DiffRAGOptions) else DiffRAGOptions().merged(options)
    cfg = config if isinstance(config, TCRAGConfig) else TCRAGConfig.model_validate(config or {})
    chat = resolve_chat_model(model)
    if not isinstance(chat, BaseChatModel):
        raise ValueError(f"model must be a LangChain chat model, not {type(chat).__name__}")
    tools = list(tools or ())
    if any(not isinstance(t, BaseTool) for t in tools):
        raise ValueError("tools must be LangChain BaseTool objects")
    if knowledge is not None and not isinstance(knowledge, DiffRAGKnowledge):
        raise ValueError(f"knowledge must be a DiffRAGKnowledge, not {type(knowledge).__name__}")
    if documents is not None and any(not isinstance(d, Document) for d in documents):
        raise ValueError("documents must be tools.chunking.Document objects")
    case_list = [c if isinstance(c, SolvedCase) else SolvedCase.model_validate(c) for c in cases]
    if knowledge is not None and (documents is not None or case_list):
        raise ValueError("give a prebuilt knowledge= or documents=/cases= to build one, not both")
    if not (general_kg is None or general_kg == "packaged" or hasattr(general_kg, "link")):
        raise ValueError("general_kg must be 'packaged', a KnowledgeGraph or None")
    holder: dict[str, Any] = {"knowledge": knowledge}
    lock = threading.Lock()

    def run_settings(config: RunnableConfig, runtime: Runtime) -> tuple[DiffRAGOptions, TCRAGConfig]:
        """This run's options: ``context=`` may be DiffRAGOptions, TCRAGConfig or a mapping of either's fields."""
        context = getattr(runtime, "context", None)
        if context is not None and not isinstance(context, (DiffRAGOptions, TCRAGConfig, Mapping)):
            raise ValueError(f"context must be DiffRAGOptions, TCRAGConfig or a mapping, not {type(context).__name__}")
        opts = base_options.merged(None if isinstance(context, TCRAGConfig) else context)
        run_cfg = resolve_config(cfg, configurable=(config or {}).get("configurable"),
                                 context=None if isinstance(context, DiffRAGOptions) else context)
        return opts, run_cfg

    def get_embeddings() -> Any:
        if embeddings is not None:
            return embeddings
        from ...tools.documents import default_embeddings

        return default_embeddings()

    def get_general_kg(opts: DiffRAGOptions) -> Any:
        if not opts.use_general_kg or general_kg is None:
            return None
        if general_kg == "packaged":
            from ...tools.knowledge_graph import KnowledgeGraph

            return KnowledgeGraph.packaged()
        return general_kg

    def get_knowledge(config: RunnableConfig, step: int) -> DiffRAGKnowledge:
        with lock:
            if holder["knowledge"] is None:
                def progress(chunk_id: str, triples: Sequence[Triple], calls: ExtractionCalls) -> None:
                    emit(TraceEvent(step=step, action="Extract_Triples", op="noop", content=chunk_id,
                                    detail=json.dumps({"triples": [t.as_list() for t in triples],
                                                       "llm_calls": calls.llm_calls})), config)

                found, path, built = default_knowledge(model=chat, documents=documents, cases=case_list,
                                                       options=base_options, config=cfg, model_id=model_id,
                                                       on_passage=progress)
                emit(TraceEvent(step=step, action="Knowledge_Graph", op="noop", content=str(path or "(not cached)"),
                                detail=json.dumps({"built_now": built})), config)
                holder["knowledge"] = found
            return holder["knowledge"]

    def halt(state: DiffRAGState, step: int, reason: str, *, answer: Optional[str], error: Optional[str],
             config: RunnableConfig) -> dict[str, Any]:
        event = TraceEvent(step=step, action="Halt", op="halt", content=answer or error or "",
                           detail=json.dumps({"halt_reason": reason}))
        emit(event, config)
        return {"answer": answer, "halt_reason": reason, "error": error, "answer_validated": False,
                "trace": [*state.get("trace", []), event],
                "messages": [AIMessage(content=answer if answer else f"No answer: {error or reason}")]}

    def start(state: DiffRAGState, config: RunnableConfig) -> dict[str, Any]:
        question, problem = extract_question(state, cfg)
        base = {"llm_calls": 0, "tool_calls": 0, "retrievals": 0, "steps": 0, "state_value": None,
                "token_usage": {"prompt": 0, "completion": 0}, "evidence": [], "reasoning_path": [],
                "structured_answer": None}
        if problem:
            raw = state.get("question")
            out = halt({}, 0, "invalid_input", answer=None, error=problem, config=config)
            return {**base, "question": raw if isinstance(raw, str) else "", **out}
        event = TraceEvent(step=0, action="User_Query", op="push", content=question, stack_depth=1)
        emit(event, config)
        update = {**base, "question": question, "halt_reason": None, "error": None, "answer": None,
                  "answer_validated": False, "path_source": "", "trace": [event]}
        if not last_human_is(state, question):  # the conversation shows what was asked
            update["messages"] = [HumanMessage(content=question)]
        return update

    def reasoning_path(state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        opts, run_cfg = run_settings(config, runtime)
        calls = ExtractionCalls()
        try:
            path = extract_triples(
                chat, PATH_SYSTEM, f"Question: {state['question']}\n\nReasoning path:",
                max_triples=opts.max_path_triples, max_retries=opts.max_format_retries,
                max_new_tokens=max_new_tokens_for(opts, run_cfg), temperature=run_cfg.temperature,
                allow_unknown=True, config=config, calls=calls,
            )
        except Exception as exc:
            out = halt(state, 1, "model_error", answer=None, error=f"{type(exc).__name__}: {exc}", config=config)
            return {**out, "llm_calls": state.get("llm_calls", 0) + calls.llm_calls + 1, "steps": 1}
        counters = {"llm_calls": state.get("llm_calls", 0) + calls.llm_calls, "steps": 1,
                    "token_usage": add_token_usage(state, calls.prompt_tokens, calls.completion_tokens)}
        events = []
        if not path:  # the model wrote no triple: match the question itself (recorded, not hidden)
            events.append(TraceEvent(step=1, action="Reasoning_Path", op="format_error", content=state["question"],
                                     detail=json.dumps({"problems": calls.problems[:10], "fallback": "question"})))
            rows, source = [], "question"
        else:
            rows, source = [t.as_list() for t in path], "model"
        events.append(TraceEvent(step=1, action="Reasoning_Path", op="push",
                                 content="\n".join(" | ".join(r) for r in rows) or state["question"], stack_depth=2,
                                 detail=json.dumps({"triples": rows, "source": source,
                                                    "problems": calls.problems[:10]})))
        for e in events:
            emit(e, config)
        return {**counters, "reasoning_path": rows, "path_source": source, "trace": [*state.get("trace", []), *events]}

    def recall_node(state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        opts, _ = run_settings(config, runtime)
        step = state.get("steps", 0) + 1
        try:
            knowledge_now = get_knowledge(config, step)
            if state.get("path_source") == "question":
                path = [Triple(subject=state["question"][:MAX_PART_CHARS], relation=UNKNOWN, object=UNKNOWN)]
            else:
                path = [Triple(subject=s, relation=r, object=o) for s, r, o in state.get("reasoning_path", [])]
            found = recall(knowledge_now, path, embeddings=get_embeddings(), options=opts,
                           general_kg=get_general_kg(opts))
        except Exception as exc:
            out = halt(state, step, "retrieval_error", answer=None, error=f"{type(exc).__name__}: {exc}", config=config)
            return {**out, "steps": step}
        evidence = [r.model_dump() for r in found]
        event = TraceEvent(step=step, action="Recall", op="push", stack_depth=3,
                           content="\n".join(" | ".join(r.triple) for r in found),
                           detail=json.dumps({"recalled": [{"triple": r.triple, "layer": r.layer,
                                                            "similarity": r.similarity,
                                                            "passages": [p["id"] for p in r.passages],
                                                            "cases": [c["id"] for c in r.cases]} for r in found]}))
        emit(event, config)
        return {"evidence": evidence, "retrievals": state.get("retrievals", 0) + len(state.get("reasoning_path") or [1]),
                "steps": step, "trace": [*state.get("trace", []), event]}

    def answer_node(state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> dict[str, Any]:
        opts, run_cfg = run_settings(config, runtime)
        step = state.get("steps", 0) + 1
        recalled = [RecalledTriple.model_validate(e) for e in state.get("evidence", [])]
        path = "\n".join(" | ".join(r) for r in state.get("reasoning_path", [])) or "(none)"
        prompt = (f"Reasoning path:\n{path}\n\nEvidence:\n{evidence_text(recalled, max_tokens=opts.max_evidence_tokens)}"
                  f"\n\nQuestion:\n{state['question']}")
        fmt = run_cfg.answer_format
        rule = answer_format.instructions(fmt)
        system = ANSWER_SYSTEM + (f" The line after 'Answer:' is your Conclusion. {rule}" if rule else "")
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        kwargs = generation_kwargs(chat, max_new_tokens_for(opts, run_cfg), run_cfg.temperature)
        calls, retries, prompt_tokens, completion_tokens = 0, 0, 0, 0
        while True:  # bounded: at most max_format_retries re-prompts when the answer does not fit the format
            calls += 1
            prompt_tokens += sum(count_tokens(content_text(m.content)) for m in messages)
            try:
                text = content_text(chat.invoke(messages, config=child_config(config), **kwargs).content)
            except Exception as exc:
                out = halt(state, step, "model_error", answer=None, error=f"{type(exc).__name__}: {exc}", config=config)
                return {**out, "steps": step, "llm_calls": state.get("llm_calls", 0) + calls,
                        "token_usage": add_token_usage(state, prompt_tokens, completion_tokens)}
            completion_tokens += count_tokens(text)
            final = final_answer(text)
            structured, problem = answer_format.check(fmt, final)
            if fmt is None or problem is None or retries >= run_cfg.max_format_retries:
                break
            retries += 1
            messages = [*messages, AIMessage(content=text or "(empty)"),
                        HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
        event = TraceEvent(step=step, action="Answer", op="push", content=final, stack_depth=4,
                           detail=json.dumps({"evidence": len(recalled), "format_retries": retries}))
        emit(event, config)
        if not final:
            reason, error = "model_error", "the model wrote no answer"
        elif problem is not None:
            reason, error = "format_error", f"no answer in the asked format after {retries} re-prompts: {problem}"
        else:
            reason, error = "answered", None
        out = halt({**state, "trace": [*state.get("trace", []), event]}, step, reason, answer=final or None,
                   error=error, config=config)
        return {**out, "raw_output": text, "steps": step, "llm_calls": state.get("llm_calls", 0) + calls,
                "structured_answer": structured if fmt is not None and problem is None else None,
                "token_usage": add_token_usage(state, prompt_tokens, completion_tokens)}

    def after(state: DiffRAGState) -> str:
        return "end" if state.get("halt_reason") else "next"

    builder = StateGraph(DiffRAGState)  # context: DiffRAGOptions, TCRAGConfig or a mapping (run_settings)
    builder.add_node("Start", start)
    builder.add_node("Reasoning_Path", reasoning_path)
    builder.add_node("Recall", recall_node)
    builder.add_node("Answer", answer_node)
    builder.add_edge(START, "Start")
    builder.add_conditional_edges("Start", after, {"next": "Reasoning_Path", "end": END})
    builder.add_conditional_edges("Reasoning_Path", after, {"next": "Recall", "end": END})
    builder.add_conditional_edges("Recall", after, {"next": "Answer", "end": END})
    builder.add_edge("Answer", END)
    return builder.compile(checkpointer=checkpointer, name=name)
