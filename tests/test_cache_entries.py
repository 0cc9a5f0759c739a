"""tcrag_langgraph/models/cache_entries.py: entries made from a model file name their source, and
writing a new one removes those whose source is gone or changed (each reinstall used to leave a
270 MB float16 copy and a saved-state folder behind)."""

from __future__ import annotations

import os
from pathlib import Path

from tcrag_langgraph.models.cache_entries import has_record, prune_stale, record_source


def _touch_later(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # as a reinstall would


def test_files_of_changed_or_missing_sources_go_and_the_rest_stay(tmp_path):
    cache = tmp_path / "gguf-f16"
    cache.mkdir()

    def copy_of(src: Path, key: str) -> Path:
        copy = cache / f"{src.stem}-{key}.f16.gguf"
        copy.write_bytes(b"GGUF")
        record_source(copy, src, src.stat())
        return copy

    first_src, other_src = tmp_path / "SmolLM2.gguf", tmp_path / "Other.gguf"
    for src in (first_src, other_src):
        src.write_bytes(b"GGUF model")
    first, other = copy_of(first_src, "aaaaaaaaaaaa"), copy_of(other_src, "bbbbbbbbbbbb")
    assert has_record(first)
    older = cache / "SmolLM2-0123456789ab.f16.gguf"  # from before the records, same model
    older.write_bytes(b"GGUF")
    unrelated_old = cache / "Qwen-0123456789ab.f16.gguf"  # from before the records, another model
    unrelated_old.write_bytes(b"GGUF")
    _touch_later(first_src)
    second = copy_of(first_src, "cccccccccccc")
    prune_stale(cache, "*.f16.gguf", keep=second, stem=first_src.stem)
    assert not first.exists() and not older.exists() and not has_record(first)
    assert second.is_file() and other.is_file() and unrelated_old.is_file()
    other_src.unlink()
    prune_stale(cache, "*.f16.gguf", keep=second, stem=first_src.stem)
    assert not other.exists() and not has_record(other) and second.is_file() and unrelated_old.is_file()


def test_folders_and_extra_facts(tmp_path):
    """Saved-state folders also depend on the llama.cpp build: another build's folder is stale."""
    states = tmp_path / "llama-states"
    src = tmp_path / "model.gguf"
    src.write_bytes(b"GGUF")
    old_build = states / "model-aaaaaaaaaaaa"
    old_build.mkdir(parents=True)
    (old_build / "x.kv").write_bytes(b"kv")
    record_source(old_build, src, src.stat(), extra={"llama_cpp": "0.3.35"})
    current = states / "model-bbbbbbbbbbbb"
    current.mkdir()
    record_source(current, src, src.stat(), extra={"llama_cpp": "0.3.36"})
    prune_stale(states, "*", keep=current, stem="model", extra={"llama_cpp": "0.3.36"})
    assert not old_build.exists() and not has_record(old_build) and current.is_dir() and has_record(current)


def test_an_unreadable_record_is_left_alone(tmp_path):
    entry = tmp_path / "m-aaaaaaaaaaaa.f16.gguf"
    entry.write_bytes(b"GGUF")
    entry.with_name(entry.name + ".source.json").write_text("{not json")
    prune_stale(tmp_path, "*.f16.gguf", keep=tmp_path / "other", stem="m")
    assert entry.exists()
