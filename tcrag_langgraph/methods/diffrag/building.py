"""Building the knowledge: the packaged PubMedQA-L abstracts as documents, the macro-micro graph
(:func:`build_macro_micro_graph`), the case overlay (:func:`add_cases`) and the default knowledge,
built once per content and model and cached on disk (:func:`default_knowledge`)."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

from langchain_core.language_models import BaseChatModel

from ...core.config import TCRAGConfig
from ...models.constrained import constraint_for
from ...tools.chunking import Document, Section, chunk_document
from .extraction import ExtractionCalls, decodes_together, extract_triples, extract_triples_together
from .knowledge import DiffRAGKnowledge, SolvedCase
from .options import DiffRAGOptions, max_new_tokens_for
from .parsing import Triple
from .prompts import EXTRACT_SYSTEM
from .reply_forms import triples_form

#: Bumped when a prompt or the stored layout changes, so cached graphs are rebuilt.
FORMAT_VERSION = 1

#: A batched build hands the model this many batches' worth of passages at a time: enough that the batch
#: stays full (continuous batching) for most of a group, few enough that progress is reported often.
_GROUPS_PER_BATCH = 4


def packaged_documents(*, max_passages: int, ids: Optional[Iterable[str]] = None,
                       exclude_ids: Iterable[str] = ()) -> list[Document]:
    """The first packaged PubMedQA-L abstracts, read with the project's loader, holding at least
    ``max_passages`` sections (each stored record is one section of an abstract).

    ``ids`` keeps only those abstracts (PubMed ids, in file order); ``exclude_ids`` drops those (the
    evaluated questions' own abstracts in a ``--exclude-eval-docs`` run).
    """
    from ...tools.documents import PACKAGED_CORPUS, packaged_data_dir
    from ...tools.indexing import read_documents

    if not isinstance(max_passages, int) or max_passages < 1:
        raise ValueError(f"max_passages must be a positive int, got {max_passages!r}")
    wanted = None if ids is None else {str(i) for i in ids}
    dropped = {str(i) for i in exclude_ids}
    path = packaged_data_dir() / f"{PACKAGED_CORPUS}.jsonl.gz"
    grouped: dict[str, tuple[str, list[Section]]] = {}
    records = 0
    for record in read_documents([path], on_error="stop"):
        if record.source_id in dropped or (wanted is not None and record.source_id not in wanted):
            continue
        if record.source_id not in grouped:
            if records >= max_passages:
                break
            grouped[record.source_id] = (record.title, [])
        grouped[record.source_id][1].append(Section(str(record.metadata.get("section") or ""), record.text))
        records += 1
    return [Document(sid, title=title, sections=tuple(sections), metadata={"dataset": "PubMedQA-L"})
            for sid, (title, sections) in grouped.items()]


def build_macro_micro_graph(
    documents: Iterable[Document],
    *,
    model: BaseChatModel,
    book: str = "documents",
    options: Optional[DiffRAGOptions] = None,
    config: Optional[TCRAGConfig] = None,
    knowledge: Optional[DiffRAGKnowledge] = None,
    on_passage: Any = None,
) -> DiffRAGKnowledge:
    """Heading tree plus per-passage triples of ``documents`` (at most ``options.max_passages``).

    Each document is a chapter, each of its sections a section, each chunk a passage; the model
    extracts up to ``max_triples_per_passage`` triples per passage, each linked to its passage.
    ``on_passage(chunk_id, triples, calls)`` is called after each passage (progress / events); with
    ``options.extract_sequences > 1`` and a model that decodes replies together (the llama.cpp chat model),
    the passages are extracted in groups of ``4 * extract_sequences`` and reported when their group is done.
    """
    options = options or DiffRAGOptions()
    config = config or TCRAGConfig()
    if not isinstance(model, BaseChatModel):
        raise ValueError(f"model must be a LangChain chat model, not {type(model).__name__}")
    if options.chunk_overlap >= options.chunk_tokens:
        raise ValueError("chunk_overlap must be smaller than chunk_tokens")
    knowledge = knowledge if knowledge is not None else DiffRAGKnowledge()
    together = options.extract_sequences > 1 and decodes_together(model)
    # a group of passages is extracted at once; its progress is reported when it is done
    group_size = options.extract_sequences * _GROUPS_PER_BATCH if together else 1
    group: list[tuple[Any, Any]] = []

    def extract(group: list[tuple[Any, Any]]) -> None:
        texts = [f"Text:\n{chunk.search_text}\n\nTriples:" for chunk, _ in group]
        common = dict(max_triples=options.max_triples_per_passage, max_retries=options.max_format_retries,
                      max_new_tokens=max_new_tokens_for(options, config), constrain=config.constrain_replies)
        if together:
            found = extract_triples_together(model, EXTRACT_SYSTEM, texts, sequences=options.extract_sequences,
                                             **common)
        else:
            calls = ExtractionCalls()
            found = [(extract_triples(model, EXTRACT_SYSTEM, texts[0], calls=calls, **common), calls)]
        for (chunk, passage), (triples, calls) in zip(group, found):
            for triple in triples:
                knowledge.add_triple(triple, passage=passage)
            if on_passage is not None:
                on_passage(chunk.chunk_id, triples, calls)

    done = 0
    for document in documents:
        if not isinstance(document, Document):
            raise ValueError(f"documents must be tools.chunking.Document objects, not {type(document).__name__}")
        for chunk in chunk_document(document, chunk_tokens=options.chunk_tokens, overlap=options.chunk_overlap):
            if done >= options.max_passages:
                break
            passage = knowledge.add_passage(book=book, chapter=document.title or document.source_id,
                                            section=chunk.section, chunk_id=chunk.chunk_id, text=chunk.text)
            group.append((chunk, passage))
            done += 1
            if len(group) >= group_size:
                extract(group)
                group = []
        if done >= options.max_passages:
            break
    if group:
        extract(group)
    return knowledge


def add_cases(
    knowledge: DiffRAGKnowledge,
    cases: Iterable[SolvedCase | Mapping[str, Any]],
    *,
    model: BaseChatModel,
    options: Optional[DiffRAGOptions] = None,
    config: Optional[TCRAGConfig] = None,
) -> dict[str, list[Triple]]:
    """Extract triples from solved cases into the overlay, each linked to its case; ``{case_id: triples}``."""
    options = options or DiffRAGOptions()
    config = config or TCRAGConfig()
    if not isinstance(knowledge, DiffRAGKnowledge):
        raise ValueError("knowledge must be a DiffRAGKnowledge")
    parsed = [c if isinstance(c, SolvedCase) else SolvedCase.model_validate(c) for c in cases]
    found: dict[str, list[Triple]] = {}
    for case in parsed:
        node = knowledge.add_case(case)
        text = f"Question: {case.question}\nReasoning: {case.reasoning}\nAnswer: {case.answer}\n\nTriples:"
        triples = extract_triples(
            model, EXTRACT_SYSTEM, text, max_triples=options.max_triples_per_passage,
            max_retries=options.max_format_retries, max_new_tokens=max_new_tokens_for(options, config),
            constrain=config.constrain_replies,
        )
        for triple in triples:
            knowledge.add_triple(triple, case=node)
        found[case.case_id] = list(triples)
    return found


def knowledge_cache_dir() -> Path:
    """Where built graphs are cached: ``<tcrag_langgraph.models.weights.cache_dir()>/diffrag``."""
    from ...models.weights import cache_dir

    return cache_dir() / "diffrag"


_DEFAULT_LOCK = threading.Lock()
_DEFAULT_MEMO: dict[str, DiffRAGKnowledge] = {}


def _content_key(model_id: str, documents: Sequence[Document], cases: Sequence[SolvedCase],
                 options: DiffRAGOptions, max_new_tokens: int, constrained: Optional[str] = None,
                 together: bool = False) -> str:
    digest = hashlib.sha256()
    build = {k: getattr(options, k) for k in ("max_passages", "chunk_tokens", "chunk_overlap",
                                              "max_triples_per_passage", "max_format_retries")}
    if together:  # batched kernels break near ties otherwise: other triples (unbatched keys as before)
        build["extract_sequences"] = options.extract_sequences
    what = {"v": FORMAT_VERSION, "model": model_id, "options": build, "max_new_tokens": max_new_tokens,
            "prompt": EXTRACT_SYSTEM}
    if constrained is not None:  # triples written under a grammar are other triples (unconstrained keys as before)
        what.update(constrained=constrained, form=triples_form(options.max_triples_per_passage).grammar)
    digest.update(json.dumps(what, sort_keys=True).encode())
    for d in documents:
        digest.update(json.dumps([d.source_id, d.title, d.text, [(s.name, s.text) for s in d.sections]]).encode())
    for c in cases:
        digest.update(c.model_dump_json().encode())
    return digest.hexdigest()[:32]


def default_knowledge(
    *,
    model: BaseChatModel,
    documents: Optional[Sequence[Document]] = None,
    cases: Sequence[SolvedCase] = (),
    book: Optional[str] = None,
    options: Optional[DiffRAGOptions] = None,
    config: Optional[TCRAGConfig] = None,
    model_id: Optional[str] = None,
    on_passage: Any = None,
) -> tuple[DiffRAGKnowledge, Optional[Path], bool]:
    """The knowledge for ``documents`` (default: the first packaged PubMedQA abstracts) and ``cases``,
    built once per content and model and cached at ``cache_dir()/diffrag/<key>.nq.gz``.

    ``model_id`` names the extracting model in the cache key (default:
    :func:`tcrag_langgraph.models.local.chat_model_id`); a model that cannot be named gets its graph built
    for this process only (path ``None``): triples of one model are never served for another.
    Returns ``(knowledge, cache path or None, built_now)``.
    """
    from ...models.local import chat_model_id

    options = options or DiffRAGOptions()
    config = config or TCRAGConfig()
    docs = list(documents) if documents is not None else packaged_documents(max_passages=options.max_passages)
    book = book or ("PubMedQA-L abstracts" if documents is None else "documents")
    if model_id is None:
        try:
            model_id = chat_model_id(model)
        except ValueError:
            model_id = None
    constraint = constraint_for(model, triples_form(options.max_triples_per_passage)) if config.constrain_replies else None
    # the model's class says whether it batches (asking its backend would load it, cached graph or not)
    together = options.extract_sequences > 1 and getattr(model, "decodes_together", False) is True
    key = _content_key(model_id or f"unnamed:{id(model)}", docs, list(cases), options,
                       max_new_tokens_for(options, config), constraint.how if constraint is not None else None,
                       together)
    path = knowledge_cache_dir() / f"{key}.nq.gz" if model_id else None
    with _DEFAULT_LOCK:
        if key in _DEFAULT_MEMO:
            return _DEFAULT_MEMO[key], path, False
        if path is not None and path.exists():
            knowledge = DiffRAGKnowledge.load(path)
            built = False
        else:
            knowledge = build_macro_micro_graph(docs, model=model, book=book, options=options, config=config,
                                                on_passage=on_passage)
            if cases:
                add_cases(knowledge, cases, model=model, options=options, config=config)
            if path is not None:
                knowledge.save(path)
            built = True
        _DEFAULT_MEMO[key] = knowledge
        return knowledge, path, built
