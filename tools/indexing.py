"""Build a document index from files: read, chunk, embed, and store (embedded folder or Elasticsearch).

Accepted inputs (files, or folders searched recursively in sorted order):

* ``.jsonl`` / ``.ndjson`` — one JSON object per line;
* ``.json`` — a list of objects, an object mapping ids to objects (PubMedQA's ``ori_pqal.json``),
  or a single object;
* ``.txt`` / ``.md`` / ``.markdown`` — one document per file; ``#`` headings become sections.

A JSON record needs an id (``id``, ``source_id``, ``doc_id``, ``_id``, ``pmid``; else
``file:line``) and text in one of: ``text`` / ``content`` / ``body`` / ``abstract``, ``sections``
(a list of ``{"name"|"title"|"heading": ..., "text": ...}`` or an object name -> text), or
PubMedQA's ``CONTEXTS`` + ``LABELS``. ``title`` (or PubMedQA's ``QUESTION``) is the title.
Anything else small and scalar is kept as metadata.

Bad input is reported with its file and line; ``on_error="skip"`` (default) keeps going,
``"stop"`` raises :class:`IndexingError` at the first problem.

Example:
    >>> import json, tempfile, pathlib
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "docs.jsonl").write_text(json.dumps({"id": "a", "text": "Heparin is an anticoagulant."}) + "\\n{broken\\n")
    >>> report = build_index([folder], out=folder / "index", progress=False)
    >>> report.documents, report.chunks, [(p.line, p.message[:17]) for p in report.problems]
    (1, 1, [(2, 'invalid JSON: Exp')])
"""

from __future__ import annotations

import gzip
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Literal, Mapping, Optional

from .chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP, Document, Section, chunk_documents, split_markdown_sections
from .documents import DocumentStore, EmbeddedStore

__all__ = [
    "TEXT_SUFFIXES",
    "JSON_SUFFIXES",
    "FileProblem",
    "IndexingError",
    "IndexReport",
    "document_from_record",
    "read_documents",
    "build_index",
    "register",
]

JSON_SUFFIXES = (".json", ".jsonl", ".ndjson", ".jsonl.gz")
TEXT_SUFFIXES = (".txt", ".md", ".markdown")
_ID_KEYS = ("id", "source_id", "doc_id", "_id", "pmid", "PMID")
_TEXT_KEYS = ("text", "content", "body", "abstract", "contents")
_TITLE_KEYS = ("title", "QUESTION", "name")
_SECTION_NAME_KEYS = ("name", "title", "heading", "section", "label")


@dataclass(frozen=True)
class FileProblem:
    """Something wrong with an input file; ``line`` is 1-based (None for the whole file)."""

    path: str
    line: Optional[int]
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.message}" if self.line else f"{self.path}: {self.message}"


class IndexingError(ValueError):
    """Raised with ``on_error="stop"``; ``problem`` says where."""

    def __init__(self, problem: FileProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


@dataclass
class IndexReport:
    """What :func:`build_index` did."""

    target: str
    files: int = 0
    documents: int = 0
    chunks: int = 0
    total_chunks: int = 0
    seconds: float = 0.0
    problems: list[FileProblem] = field(default_factory=list)


def _text(value: Any) -> str:
    return value.strip() if isinstance(value, str) else ""


def document_from_record(record: Mapping[str, Any], *, default_id: str) -> Document:
    """Turn one JSON object into a :class:`Document` (see the module docstring for the fields).

    Example:
        >>> d = document_from_record({"pmid": 7, "title": "T", "sections": {"METHODS": "m", "RESULTS": "r"}}, default_id="f:1")
        >>> d.source_id, d.title, [s.name for s in d.sections]
        ('7', 'T', ['METHODS', 'RESULTS'])
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"expected a JSON object, got {type(record).__name__}")
    source_id = next((str(record[k]).strip() for k in _ID_KEYS if record.get(k) not in (None, "")), default_id)
    title = next((_text(record[k]) for k in _TITLE_KEYS if _text(record.get(k))), "")
    text = next((_text(record[k]) for k in _TEXT_KEYS if _text(record.get(k))), "")
    sections: list[Section] = []
    raw_sections = record.get("sections")
    if isinstance(raw_sections, Mapping):
        sections = [Section(str(name), _text(body)) for name, body in raw_sections.items() if _text(body)]
    elif isinstance(raw_sections, list):
        for i, item in enumerate(raw_sections):
            if isinstance(item, str):
                sections.append(Section("", item.strip()))
            elif isinstance(item, Mapping):
                name = next((_text(item[k]) for k in _SECTION_NAME_KEYS if _text(item.get(k))), "")
                body = next((_text(item[k]) for k in _TEXT_KEYS if _text(item.get(k))), "")
                if body:
                    sections.append(Section(name, body))
            else:
                raise ValueError(f"sections[{i}] must be text or an object, got {type(item).__name__}")
    elif raw_sections is not None:
        raise ValueError(f"'sections' must be a list or an object, got {type(raw_sections).__name__}")
    contexts = record.get("CONTEXTS")
    if isinstance(contexts, list):  # PubMedQA
        labels = record.get("LABELS") if isinstance(record.get("LABELS"), list) else []
        labels = labels if len(labels) == len(contexts) else [""] * len(contexts)
        sections.extend(Section(str(l).strip(), _text(c)) for l, c in zip(labels, contexts) if _text(c))
    if not text and not any(s.text for s in sections):
        raise ValueError(f"record {source_id!r} has no text (expected one of {', '.join(_TEXT_KEYS)}, sections or CONTEXTS)")
    used = {*_ID_KEYS, *_TEXT_KEYS, *_TITLE_KEYS, "sections", "CONTEXTS", "LABELS"}
    metadata = {k: v for k, v in record.items() if k not in used and isinstance(v, (str, int, float, bool)) and len(str(v)) <= 200}
    return Document(source_id, text=text, title=title, sections=tuple(sections), metadata=metadata)


def _iter_files(paths: Iterable[str | Path]) -> Iterator[Path]:
    for path in paths:
        path = Path(path)
        if path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and child.name.lower().endswith(JSON_SUFFIXES + TEXT_SUFFIXES) and not any(
                    part.startswith(".") for part in child.relative_to(path).parts
                ):
                    yield child
        else:
            yield path


def read_documents(
    paths: Iterable[str | Path],
    *,
    on_error: Literal["skip", "stop"] = "skip",
    problems: Optional[list[FileProblem]] = None,
) -> Iterator[Document]:
    """Documents from files and folders; problems are appended to ``problems`` (or raised on "stop")."""
    if on_error not in ("skip", "stop"):
        raise ValueError("on_error must be 'skip' or 'stop'")
    problems = problems if problems is not None else []

    def report(path: Path, line: Optional[int], message: str) -> None:
        problem = FileProblem(str(path), line, message)
        if on_error == "stop":
            raise IndexingError(problem)
        problems.append(problem)

    for path in _iter_files(paths):
        name = path.name.lower()
        if not path.is_file():
            report(path, None, "no such file")
            continue
        if not name.endswith(JSON_SUFFIXES + TEXT_SUFFIXES):
            report(path, None, f"unsupported file type (use {', '.join(JSON_SUFFIXES + TEXT_SUFFIXES)})")
            continue
        try:
            raw = gzip.decompress(path.read_bytes()) if name.endswith(".gz") else path.read_bytes()
            content = raw.decode("utf-8-sig")
        except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile) as exc:
            report(path, None, f"cannot read: {exc}")
            continue
        if name.endswith((".jsonl", ".ndjson", ".jsonl.gz")):
            for lineno, line in enumerate(content.splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    report(path, lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")
                    continue
                try:
                    yield document_from_record(record, default_id=f"{path.stem}:{lineno}")
                except (ValueError, TypeError) as exc:
                    report(path, lineno, str(exc))
        elif name.endswith(".json"):
            try:
                data = json.loads(content)
            except json.JSONDecodeError as exc:
                report(path, exc.lineno, f"invalid JSON: {exc.msg} (column {exc.colno})")
                continue
            if isinstance(data, list):
                items = [(f"{path.stem}:{i}", item, None) for i, item in enumerate(data)]
            elif isinstance(data, Mapping) and data and all(isinstance(v, Mapping) for v in data.values()) and not any(
                k in data for k in _TEXT_KEYS + ("sections", "CONTEXTS")
            ):
                items = [(str(key), item, str(key)) for key, item in data.items()]  # {"id": {...}, ...}
            else:
                items = [(path.stem, data, None)]
            for default_id, item, key in items:
                try:
                    if key is not None and isinstance(item, Mapping) and not any(item.get(k) for k in _ID_KEYS):
                        item = {**item, "id": key}
                    yield document_from_record(item, default_id=default_id)
                except (ValueError, TypeError) as exc:
                    report(path, None, f"record {default_id}: {exc}")
        else:
            title, sections = split_markdown_sections(content)
            if not sections:
                report(path, None, "empty text file")
                continue
            yield Document(str(path.stem), title=title or path.stem, sections=sections, metadata={"path": str(path)})


def build_index(
    paths: Iterable[str | Path],
    *,
    out: str | Path | None = None,
    name: str = "store",
    es_url: Optional[str] = None,
    index: str = "tcrag-docs",
    api_key: Optional[str] = None,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    overlap: int = DEFAULT_OVERLAP,
    on_error: Literal["skip", "stop"] = "skip",
    recreate: bool = False,
    embeddings: Any = None,
    progress: bool = True,
) -> IndexReport:
    """Read, chunk, embed and index ``paths`` into an embedded store folder (``out``) or an
    Elasticsearch index (``es_url`` + ``index``). Existing content is kept and updated
    (same chunk ids replace) unless ``recreate``. Inputs that hold no document at all are an
    :class:`IndexingError` raised before anything is created or written.
    """
    if (out is None) == (es_url is None):
        raise ValueError("give exactly one of out= (embedded store folder) or es_url= (Elasticsearch)")
    started = time.perf_counter()
    problems: list[FileProblem] = []
    paths = [Path(p) for p in paths]
    if not paths:
        raise ValueError("no input paths")
    files = list(_iter_files(paths))
    documents: dict[str, Document] = {}
    for doc in read_documents(paths, on_error=on_error, problems=problems):
        if doc.source_id in documents:
            problem = FileProblem(str(doc.metadata.get("path") or "<input>"), None, f"duplicate id {doc.source_id!r}: the later record replaces the earlier")
            if on_error == "stop":
                raise IndexingError(problem)
            problems.append(problem)
        documents[doc.source_id] = doc
    chunks = list(chunk_documents(documents.values(), chunk_tokens=chunk_tokens, overlap=overlap))
    if not chunks:  # nothing to index: nothing is created or written
        found = "; ".join(str(p) for p in problems[:3]) or "the inputs hold no documents"
        raise IndexingError(FileProblem(", ".join(str(p) for p in paths)[:200], None,
                                        f"nothing to index, nothing written ({found})"))

    store: DocumentStore
    if out is not None:
        out = Path(out)
        manifest = out / f"{name}.manifest.json"
        store = (
            EmbeddedStore.load(out, name=name, embeddings=embeddings)
            if manifest.exists() and not recreate
            else EmbeddedStore(embeddings=embeddings)
        )
        target = f"{out}/{name}"
    else:
        from .elasticsearch_store import ElasticsearchStore

        store = ElasticsearchStore(es_url, index=index, api_key=api_key, embeddings=embeddings, request_timeout=60.0)
        store.create_index(recreate=recreate)
        target = f"{store.url} index {index}"

    try:
        if progress and chunks:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            with Progress(
                TextColumn("[bold]indexing[/bold] {task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                transient=False,
            ) as bar:
                task = bar.add_task(target, total=len(chunks))
                added = store.add(chunks, progress=lambda n: bar.advance(task, n))
        else:
            added = store.add(chunks)
        if isinstance(store, EmbeddedStore):
            store.save(out, name=name, extra={"chunk_tokens": chunk_tokens, "overlap": overlap})
        total = store.count()
    finally:
        store.close()
    return IndexReport(
        target=target,
        files=len(files),
        documents=len(documents),
        chunks=added,
        total_chunks=total,
        seconds=time.perf_counter() - started,
        problems=problems,
    )


def register(app: Any) -> None:
    """Add the ``index`` command to the ``tcrag`` Typer app."""
    import typer
    from rich.console import Console

    @app.command("index")
    def index_command(
        paths: list[Path] = typer.Argument(..., help="JSON, JSONL, text or markdown files, or folders of them."),
        es_url: Optional[str] = typer.Option(None, "--es-url", envvar="TCRAG_ES_URL", help="Index into this Elasticsearch server."),
        index: str = typer.Option("tcrag-docs", "--index", help="Elasticsearch index name."),
        out: Optional[Path] = typer.Option(None, "--out", help="Embedded store folder (default .tcrag/docs without --es-url)."),
        name: str = typer.Option("store", "--name", help="File-name prefix of the embedded store."),
        chunk_tokens: int = typer.Option(DEFAULT_CHUNK_TOKENS, "--chunk-tokens", min=8, help="Tokens per chunk."),
        overlap: int = typer.Option(DEFAULT_OVERLAP, "--overlap", min=0, help="Tokens shared by consecutive chunks."),
        stop_on_error: bool = typer.Option(False, "--stop-on-error", help="Stop at the first bad file or line."),
        recreate: bool = typer.Option(False, "--recreate", help="Replace the existing index instead of adding to it."),
        api_key: Optional[str] = typer.Option(None, "--api-key", envvar="TCRAG_ES_API_KEY", show_default=False, help="Elasticsearch API key (prefer the env var)."),
    ) -> None:
        """Chunk, embed and index documents for the DOC_RAG tool."""
        from .documents import StoreError

        console = Console(stderr=True, soft_wrap=True)
        if es_url is None and out is None:
            out = Path(".tcrag/docs")
        if es_url is not None and out is not None:
            raise typer.BadParameter("use --out or --es-url, not both")
        if overlap >= chunk_tokens:
            raise typer.BadParameter(f"--overlap ({overlap}) must be smaller than --chunk-tokens ({chunk_tokens})")
        try:
            report = build_index(
                paths, out=out, name=name, es_url=es_url, index=index, api_key=api_key,
                chunk_tokens=chunk_tokens, overlap=overlap, on_error="stop" if stop_on_error else "skip", recreate=recreate,
            )
        except IndexingError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2)
        except (StoreError, FileNotFoundError, ValueError) as exc:
            message = str(exc).replace(api_key, "***") if api_key else str(exc)
            console.print(f"[red]error:[/red] {message}")
            raise typer.Exit(1)
        for problem in report.problems:
            console.print(f"[yellow]skipped[/yellow] {problem}")
        console.print(
            f"indexed {report.documents} documents from {report.files} files -> {report.chunks} chunks into "
            f"{report.target} ({report.total_chunks} in total) in {report.seconds:.1f} s"
            + (f", {len(report.problems)} problem(s)" if report.problems else "")
        )
