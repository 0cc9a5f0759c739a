"""The TCM-DiffRAG LangGraph graph (:class:`DiffRAG`): Start -> Reasoning_Path -> Recall ->
Answer, the nodes of :class:`DiffRAG` on the run kernel, over lazily built knowledge."""

from __future__ import annotations

import json
import threading
from typing import Any, Literal, Mapping, Optional, Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import RunnableConfig
from langgraph.runtime import Runtime
from langgraph.types import Command

from ...core import answer_format
from ...core.arguments import BuildArguments
from ...core.kernel import RunFailure, RunKernel, fresh_run
from ...core.state import TraceEvent
from ...tools.chunking import Document
from .building import default_knowledge
from .extraction import ExtractionCalls, extract_triples
from .knowledge import DiffRAGKnowledge, SolvedCase
from .options import DiffRAGOptions, max_new_tokens_for
from .parsing import MAX_PART_CHARS, UNKNOWN, Triple, final_answer
from .prompts import ANSWER_SYSTEM, PATH_SYSTEM
from .retrieval import RecalledTriple, evidence_text, recall
from .state import DiffRAGState


class DiffRAG(RunKernel):
    """Compile the TCM-DiffRAG graph: Start -> Reasoning_Path -> Recall -> Answer.

    Args:
        model: chat model (object, path, ``.gguf`` or ``"provider:model"``; None: packaged SmolLM2).
        tools: accepted like every builder's; TCM-DiffRAG retrieves from its own graph and calls no tool.
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
        checkpointer, store: LangGraph's.
        name: the compiled graph's name.
        trust_client_identity: accepted like every builder's (the method calls no tool, so no identity
            reaches one).
    """

    method = "TCM-DiffRAG"
    default_name = "diffrag"
    state_schema = DiffRAGState  # context: DiffRAGOptions, TCRAGConfig or a mapping of their fields
    options_type = DiffRAGOptions
    nodes = {"Start": "start", "Reasoning_Path": "reasoning_path", "Recall": "recall_node", "Answer": "answer"}

    @classmethod
    def prepare(cls, args: BuildArguments, *, knowledge: Optional[DiffRAGKnowledge] = None,
                documents: Optional[Sequence[Document]] = None, cases: Sequence[SolvedCase | Mapping[str, Any]] = (),
                general_kg: Any = "packaged", embeddings: Any = None, model_id: Optional[str] = None) -> "DiffRAG":
        if knowledge is not None and not isinstance(knowledge, DiffRAGKnowledge):
            raise TypeError(f"knowledge must be a DiffRAGKnowledge, not {type(knowledge).__name__}")
        if documents is not None and any(not isinstance(d, Document) for d in documents):
            raise TypeError("documents must be tools.chunking.Document objects")
        case_list = [c if isinstance(c, SolvedCase) else SolvedCase.model_validate(c) for c in cases]
        if knowledge is not None and (documents is not None or case_list):
            raise ValueError("give a prebuilt knowledge= or documents=/cases= to build one, not both")
        if isinstance(general_kg, str) and general_kg != "packaged":
            raise ValueError(f"general_kg must be 'packaged', a KnowledgeGraph or None, not {general_kg!r}")
        if not (general_kg is None or general_kg == "packaged" or hasattr(general_kg, "link")):
            raise TypeError(f"general_kg must be 'packaged', a KnowledgeGraph or None, not {type(general_kg).__name__}")
        return cls(args.model, args.tools, args.scorer, args.config, args.options,
                   trust_client_identity=args.trust_client_identity, knowledge=knowledge, documents=documents,
                   cases=case_list, general_kg=general_kg, embeddings=embeddings, model_id=model_id)

    def __init__(self, *args: Any, knowledge: Optional[DiffRAGKnowledge], documents: Optional[Sequence[Document]],
                 cases: list[SolvedCase], general_kg: Any, embeddings: Any, model_id: Optional[str],
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.knowledge = knowledge
        self.documents = documents
        self.cases = cases
        self.general_kg = general_kg
        self.embeddings = embeddings
        self.model_id = model_id
        self._lock = threading.Lock()

    def position(self, state: Mapping[str, Any]) -> tuple[int, Optional[float]]:
        """Where a run stands: 1 question, 2 reasoning path, 3 recalled evidence, 4 answer."""
        if state.get("answer") is not None or state.get("raw_output"):
            return 4, None
        return (3 if state.get("evidence") else 2 if state.get("reasoning_path") else 1), None

    def event(self, state: Mapping[str, Any], config: RunnableConfig, event: TraceEvent) -> list[TraceEvent]:
        return self.record(state.get("trace"), config, event)

    # ----- what the nodes read -----
    def get_embeddings(self) -> Any:
        if self.embeddings is None:
            from ...tools.documents import default_embeddings

            self.embeddings = default_embeddings()
        return self.embeddings

    def get_general_kg(self, opts: DiffRAGOptions) -> Any:
        if not opts.use_general_kg or self.general_kg is None:
            return None
        if self.general_kg == "packaged":
            from ...tools.knowledge_graph import KnowledgeGraph

            return KnowledgeGraph.packaged()
        return self.general_kg

    def get_knowledge(self, config: RunnableConfig, step: int) -> DiffRAGKnowledge:
        with self._lock:
            if self.knowledge is None:
                def progress(chunk_id: str, triples: Sequence[Triple], calls: ExtractionCalls) -> None:
                    self.record(None, config, TraceEvent(step=step, action="Extract_Triples", op="noop", content=chunk_id,
                                                         detail=json.dumps({"triples": [t.as_list() for t in triples],
                                                                            "llm_calls": calls.llm_calls})))

                found, path, built = default_knowledge(model=self.model, documents=self.documents, cases=self.cases,
                                                       options=self.base_options, config=self.base_config,
                                                       model_id=self.model_id, on_passage=progress)
                self.record(None, config, TraceEvent(step=step, action="Knowledge_Graph", op="noop",
                                                     content=str(path or "(not cached)"),
                                                     detail=json.dumps({"built_now": built})))
                self.knowledge = found
            return self.knowledge

    # ----- nodes -----
    def start(self, state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Reasoning_Path", "__end__"]
    ]:
        cfg, _ = self.settings(config, runtime)
        return self.begin(state, config, cfg, goto="Reasoning_Path",
                          fresh=fresh_run(retrievals=0, evidence=[], reasoning_path=[], path_source="", raw_output=""))

    def reasoning_path(self, state: DiffRAGState, config: RunnableConfig, runtime: Runtime,
                       work: dict[str, Any]) -> Command[Literal["Recall"]]:
        cfg, opts = self.settings(config, runtime)
        calls = ExtractionCalls()
        work.update(self.counters(state), steps=1)
        try:
            path = extract_triples(
                self, PATH_SYSTEM, f"Question: {state['question']}\n\nReasoning path:",
                max_triples=opts.max_path_triples, max_retries=opts.max_format_retries,
                max_new_tokens=max_new_tokens_for(opts, cfg), temperature=cfg.temperature,
                allow_unknown=True, config=config, calls=calls, constrain=cfg.constrain_replies,
            )
        finally:  # the calls made count, whether or not one failed
            work.update(llm_calls=work["llm_calls"] + calls.llm_calls, token_usage={
                "prompt": work["token_usage"]["prompt"] + calls.prompt_tokens,
                "completion": work["token_usage"]["completion"] + calls.completion_tokens})
        trace = state.get("trace")
        if not path:  # the model wrote no triple: match the question itself (recorded, not hidden)
            trace = self.record(trace, config, TraceEvent(
                step=1, action="Reasoning_Path", op="format_error", content=state["question"],
                detail=json.dumps({"problems": calls.problems[:10], "fallback": "question"})))
            rows, source = [], "question"
        else:
            rows, source = [t.as_list() for t in path], "model"
        trace = self.record(trace, config, TraceEvent(
            step=1, action="Reasoning_Path", op="push", content="\n".join(" | ".join(r) for r in rows) or state["question"],
            stack_depth=2, detail=json.dumps({"triples": rows, "source": source, "problems": calls.problems[:10]})))
        return Command(goto="Recall", update={**work, "reasoning_path": rows, "path_source": source, "trace": trace})

    def recall_node(self, state: DiffRAGState, config: RunnableConfig, runtime: Runtime) -> Command[
        Literal["Answer", "__end__"]
    ]:
        _, opts = self.settings(config, runtime)
        step = state.get("steps", 0) + 1
        try:
            knowledge_now = self.get_knowledge(config, step)
            if state.get("path_source") == "question":
                path = [Triple(subject=state["question"][:MAX_PART_CHARS], relation=UNKNOWN, object=UNKNOWN)]
            else:
                path = [Triple(subject=s, relation=r, object=o) for s, r, o in state.get("reasoning_path", [])]
            found = recall(knowledge_now, path, embeddings=self.get_embeddings(), options=opts,
                           general_kg=self.get_general_kg(opts))
        except Exception as exc:  # the graph, the embedder or the packaged graph could not be read
            raise RunFailure("retrieval_error", f"{type(exc).__name__}: {exc}", update={"steps": step}) from exc
        evidence = [r.model_dump() for r in found]
        trace = self.record(state.get("trace"), config, TraceEvent(
            step=step, action="Recall", op="push", stack_depth=3, content="\n".join(" | ".join(r.triple) for r in found),
            detail=json.dumps({"recalled": [{"triple": r.triple, "layer": r.layer, "similarity": r.similarity,
                                             "passages": [p["id"] for p in r.passages],
                                             "cases": [c["id"] for c in r.cases]} for r in found]})))
        return Command(goto="Answer", update={
            "evidence": evidence, "retrievals": state.get("retrievals", 0) + len(state.get("reasoning_path") or [1]),
            "steps": step, "trace": trace})

    def answer(self, state: DiffRAGState, config: RunnableConfig, runtime: Runtime,
               work: dict[str, Any]) -> Command[Literal["__end__"]]:
        cfg, opts = self.settings(config, runtime)
        step = state.get("steps", 0) + 1
        work.update(self.counters(state), steps=step)
        recalled = [RecalledTriple.model_validate(e) for e in state.get("evidence", [])]
        path = "\n".join(" | ".join(r) for r in state.get("reasoning_path", [])) or "(none)"
        read = evidence_text(recalled, max_tokens=opts.max_evidence_tokens)
        prompt = f"Reasoning path:\n{path}\n\nEvidence:\n{read}\n\nQuestion:\n{state['question']}"
        work["knowledge"] = [{"text": read}] if recalled else []
        fmt = cfg.answer_format
        rule = answer_format.instructions(fmt)
        system = ANSWER_SYSTEM + (f" The line after 'Answer:' is your Conclusion. {rule}" if rule else "")
        messages: list[BaseMessage] = [SystemMessage(content=system), HumanMessage(content=prompt)]
        retries = 0
        while True:  # bounded: at most max_format_retries re-prompts when the answer does not fit the format
            work["format_retries"] = retries
            text = self.ask(work, messages, cfg, config, max_new_tokens=max_new_tokens_for(opts, cfg))
            final = final_answer(text)
            structured, problem = answer_format.check(fmt, final)
            if fmt is None or problem is None or retries >= cfg.max_format_retries:
                break
            retries += 1
            messages = [*messages, AIMessage(content=text or "(empty)"),
                        HumanMessage(content=f"Your answer could not be used: {problem}. {rule}")]
        trace = self.record(state.get("trace"), config, TraceEvent(
            step=step, action="Answer", op="push", content=final, stack_depth=4,
            detail=json.dumps({"evidence": len(recalled), "format_retries": retries, "reply": text})))
        if not final:
            reason, error = "model_error", "the model wrote no answer"
        elif problem is not None:
            reason, error = "format_error", f"no answer in the asked format after {retries} re-prompts: {problem}"
        else:
            reason, error = "answered", None
        work.update(trace=trace, raw_output=text,
                    structured_answer=structured if fmt is not None and problem is None else None)
        return self.halt({**state, **work}, config, reason=reason, answer=final or None, validated=False, error=error,
                         extra=work)
