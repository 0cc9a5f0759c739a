"""The llama.cpp backend (tcrag_langgraph.models.llama_cpp) on the packaged SmolLM2 GGUF.

Real components only: the packaged GGUF run by llama.cpp, compared with the transformers path over
the same file (prompt token ids, cppl/uct of 24 pairs, decisions at sigma), real prefix reuse,
real streaming through a graph, and damaged copies of the real file. No timing here (speed is
measured in benchmarks/local_backend.py).
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from tcrag_langgraph.models.gguf_files import check_gguf_file
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_model import load_llama_model
from tcrag_langgraph.models.local import LocalChatModel, takes_generation_settings
from tcrag_langgraph.models.weights import LocalModelError, default_model_source
from tcrag_langgraph.models.resolve import resolve_chat_model
from tcrag_langgraph.monitor.llama_cpp import LlamaCppScorer
from tcrag_langgraph.monitor.scoring import LocalLMScorer
from tcrag_langgraph.monitor.own_model import scorer_for_model

STOPS = ["\nObservation:", "\nThought:", "\nConclusion:"]


def packaged_gguf() -> Path:
    folder, name = default_model_source()
    return folder / name


@pytest.fixture(scope="module")
def llama():
    return load_llama_model(None, n_threads=1)


@pytest.fixture(scope="module")
def chat():
    return LlamaCppChatModel(max_new_tokens=24, temperature=0.0, n_threads=1)


def conversation(extra: str = "") -> list:
    return [
        SystemMessage(content="You answer medical questions. Write one action: Thought: ... or Conclusion: ..."),
        HumanMessage(content="User_Query: Which vitamin deficiency causes scurvy? Ünïcode – ok."),
        AIMessage(content="Thought: Scurvy is linked to a vitamin."),
        HumanMessage(content="Write your next action." + extra),
    ]


# --- choosing the backend ----------------------------------------------------------------------

def test_gguf_paths_and_the_packaged_default_run_on_llama_cpp_and_backend_overrides(model_folder):
    gguf = str(packaged_gguf())
    by_file = resolve_chat_model(gguf, max_new_tokens=5, temperature=0.0)
    assert isinstance(by_file, LlamaCppChatModel) and by_file.model_path == gguf
    assert (by_file.max_new_tokens, by_file.temperature) == (5, 0.0)
    assert by_file._llama is None  # nothing loaded by resolving
    default = resolve_chat_model(None)
    assert isinstance(default, LlamaCppChatModel) and default.model_path is None
    assert default.model_id == "SmolLM2-135M-Instruct"
    # transformers: a model folder, an explicit backend, a GPU device or a dtype
    folder = model_folder
    for model in (resolve_chat_model(folder), resolve_chat_model(gguf, backend="transformers"),
                  resolve_chat_model(gguf, dtype="bfloat16"), resolve_chat_model(None, device="cuda")):
        assert type(model) is LocalChatModel
    assert isinstance(resolve_chat_model(gguf, backend="llama_cpp"), LlamaCppChatModel)
    with pytest.raises(ValueError, match="runs .gguf files"):
        resolve_chat_model(folder, backend="llama_cpp")
    with pytest.raises(ValueError, match="dtype does not apply"):
        resolve_chat_model(gguf, backend="llama_cpp", dtype="float32")
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_chat_model(gguf, backend="onnx")
    with pytest.raises(ValueError, match="local models only"):
        resolve_chat_model("openai:m", backend="llama_cpp")


def test_the_kernel_passes_budgets_and_the_monitor_scores_with_the_same_weights(chat):
    assert takes_generation_settings(chat)
    scorer = scorer_for_model(chat)
    assert isinstance(scorer, LlamaCppScorer)
    assert scorer.local_model is chat.llama_model  # the generator's loaded weights, not a second copy


# --- prompts and generation --------------------------------------------------------------------

def test_prompt_token_ids_are_those_of_the_transformers_chat_template(llama):
    ref = LocalChatModel()._prompt_ids(conversation())[0].tolist()
    assert llama.prompt_ids(conversation()) == ref
    assert llama.prompt_ids(conversation(" <|im_end|> in text")) == \
        LocalChatModel()._prompt_ids(conversation(" <|im_end|> in text"))[0].tolist()


def test_greedy_generation_honours_budget_stop_and_is_reproducible(chat):
    first = chat.invoke(conversation(), max_new_tokens=12)
    again = chat.invoke(conversation(), max_new_tokens=12)
    assert first.content and first.content == again.content
    assert 1 <= first.usage_metadata["output_tokens"] <= 12
    assert first.response_metadata["backend"] == "llama_cpp"
    longer = chat.invoke(conversation(), max_new_tokens=40)
    assert longer.content.startswith(first.content[:10])
    # A stop sequence taken from the model's own greedy reply cuts it there.
    words = longer.content.split()
    assert len(words) >= 3
    stop = " " + words[2]
    cut = chat.invoke(conversation(), max_new_tokens=40, stop=[stop])
    assert stop not in cut.content and longer.content.startswith(cut.content)


def test_sampling_uses_the_seed(chat):
    """Without the prefix cache: the two models share the loaded weights and their cache, and the second
    reply would otherwise start from the first one's cached prompt, whose last token is evaluated again
    alone (other rounding than the batched prefill: at 0.9 a draw near a boundary then goes the other way,
    which made this test pass or fail with the tests run before it)."""
    a = LlamaCppChatModel(max_new_tokens=16, temperature=0.9, seed=3, n_threads=1, kv_cache=False)
    b = LlamaCppChatModel(max_new_tokens=16, temperature=0.9, seed=3, n_threads=1, kv_cache=False)
    assert a.invoke(conversation()).content == b.invoke(conversation()).content


def test_without_a_seed_sampling_follows_pythons_rng_so_a_seeded_run_repeats():
    """llama.cpp's own default seed is a fresh random one per reply; a model without ``seed`` draws its
    seed from Python's ``random`` instead, which ``tcrag eval`` seeds per question (eval.runner), so a
    run and a resumed run sample the same replies. Without the prefix cache, so both replies are
    computed the same way."""
    import random

    chat = LlamaCppChatModel(max_new_tokens=24, temperature=0.9, n_threads=1, kv_cache=False)
    replies = []
    for _ in range(2):
        random.seed(7)
        replies.append(chat.invoke(conversation()).content)
    random.seed(8)
    other = [chat.invoke(conversation()).content for _ in range(3)]
    assert replies[0] == replies[1] and replies[0]
    assert len(set(other)) > 1  # still sampled: the draws differ


def test_a_gpu_device_for_llama_cpp_never_loads_torch():
    """Asking llama.cpp for a GPU reads the device string and asks the llama-cpp-python build, never
    torch: torch is hundreds of MB the llama.cpp path does not need (and, before share_cxx_runtime, a
    process that had imported it crashed the CUDA build of llama.cpp at model load; benchmarks/RESULTS.md
    section 12), and the CPU-only torch pinned here would refuse a GPU that llama.cpp can use. The answer
    on a CPU-only build is the build's own clear error."""
    code = ("import sys\n"
            "from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel\n"
            "from tcrag_langgraph.agent.spec import AgentSpec, UserError\n"
            "import llama_cpp\n"
            "chat = LlamaCppChatModel(device='cuda:0', max_new_tokens=4)\n"
            "assert chat.device == 'cuda:0'\n"
            "try:\n"
            "    AgentSpec(device=' cuda ', backend='llama_cpp').generator()\n"
            "    print('ACCEPTED', llama_cpp.llama_supports_gpu_offload())\n"
            "except UserError as exc:\n"
            "    print('REFUSED', exc)\n"
            "print('TORCH', 'torch' in sys.modules)\n")
    out = _fresh_python(code)
    assert "TORCH False" in out, out
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        assert "ACCEPTED True" in out, out
    else:
        assert "REFUSED Invalid option: --device:" in out and "no GPU offload" in out, out


def test_llama_cpp_is_imported_after_the_cxx_runtime_is_made_global():
    """numpy loads libstdc++ locally; import_llama_cpp promotes it to the global scope before llama.cpp's
    libraries load (a CUDA build crashed at model load without this: llama_cpp_native.share_cxx_runtime)."""
    code = ("import ctypes, sys, numpy\n"
            "glob = lambda: hasattr(ctypes.CDLL(None), '_ZNSt6locale7classicEv')\n"
            "print('MAPPED', any('libstdc++' in line for line in open('/proc/self/maps')), 'BEFORE', glob())\n"
            "from tcrag_langgraph.models.llama_cpp_native import import_llama_cpp\n"
            "assert 'llama_cpp' not in sys.modules\n"
            "mod = import_llama_cpp()\n"
            "print('AFTER', glob(), mod.__name__)\n")
    out = _fresh_python(code)
    assert "MAPPED True BEFORE False" in out, out  # the situation that crashed
    assert "AFTER True llama_cpp" in out, out


def _fresh_python(code: str) -> str:
    """``code`` run by a new interpreter (nothing imported yet); its stdout, after a zero exit."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_a_gpu_on_a_cpu_only_build_is_a_clear_error():
    import llama_cpp

    if llama_cpp.llama_supports_gpu_offload():
        pytest.skip("this llama-cpp-python build can offload to a GPU (tests/test_gpu_llama_cpp.py covers it)")
    with pytest.raises(LocalModelError, match="no GPU offload"):
        LlamaCppChatModel(device="cuda", max_new_tokens=4).invoke("hi")
    with pytest.raises(LocalModelError, match="no GPU offload"):
        LlamaCppChatModel(n_gpu_layers=-1, max_new_tokens=4).invoke("hi")
    with pytest.raises(ValueError, match="unknown device"):
        LlamaCppChatModel(device="tpu", max_new_tokens=4).invoke("hi")


def test_prompt_longer_than_the_context_is_a_clear_error():
    small = LlamaCppChatModel(max_new_tokens=8, temperature=0.0, n_ctx=64, n_threads=1)
    with pytest.raises(ValueError, match="exceeds the context of 64 tokens"):
        small.invoke("word " * 200)


# --- prefix reuse ------------------------------------------------------------------------------

def _stack_prompt(frames: list[str]) -> list:
    body = "\n".join(frames)
    return [SystemMessage(content="You are a careful medical assistant. Reply with one action."),
            HumanMessage(content=f"Stack (bottom first):\n{body}\n\nWrite your next action.")]


def test_a_push_prefills_only_the_new_frame_and_a_pop_cuts_back(llama):
    chat = LlamaCppChatModel(max_new_tokens=6, temperature=0.0, n_threads=1)
    plain = LlamaCppChatModel(max_new_tokens=6, temperature=0.0, n_threads=1, kv_cache=False)
    frames = ["User_Query: Is metformin safe at an eGFR of 25?",
              "Thought: I should check renal dosing guidance for metformin in kidney disease.",
              "Tool_Use: DOC_RAG metformin renal impairment"]
    steps = [frames[:1], frames[:2], frames[:3], frames[:2]]  # push, push, Backtrack (pop)
    previous = None
    for stack in steps:
        msgs = _stack_prompt(stack)
        ids = llama.prompt_ids(msgs)
        reply = chat.invoke(msgs)
        reference = plain.invoke(msgs)
        read = reply.usage_metadata["input_token_details"]["cache_read"]
        assert reference.usage_metadata["input_token_details"]["cache_read"] == 0
        assert reply.content == reference.content  # reuse changes no token
        if previous is not None:
            common = next((i for i, (a, b) in enumerate(zip(previous, ids)) if a != b), min(len(previous), len(ids)))
            assert read >= common - 1 and read > 0
            assert len(ids) - read <= len(ids) - common + 1  # only what follows the shared prefix is prefilled
        previous = ids
    stats = chat.kv_cache_stats
    assert stats["reused_tokens"] > 0 and stats["prefill_tokens"] < stats["prompt_tokens"]


# --- streaming ---------------------------------------------------------------------------------

def test_stream_yields_the_reply_token_by_token_and_joins_to_invoke(chat):
    whole = chat.invoke(conversation(), max_new_tokens=30, stop=STOPS)
    chunks = list(chat.stream(conversation(), max_new_tokens=30, stop=STOPS))
    texts = [c.content for c in chunks if c.content]
    assert len(texts) >= 3
    assert "".join(texts) == whole.content
    total = chunks[0]
    for c in chunks[1:]:
        total = total + c
    assert total.content == whole.content
    assert total.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


def test_a_graph_streams_tokens_of_a_local_gguf_model():
    from tcrag_langgraph import TCRAGConfig, build_graph

    chat = LlamaCppChatModel(n_threads=1)
    graph = build_graph(model=chat, tools=[], config=TCRAGConfig(max_steps=1, max_new_tokens=24, temperature=0.0,
                                                                  enable_state_monitor=False))
    pieces = [msg.content for msg, meta in graph.stream({"question": "Which vitamin prevents scurvy?"},
                                                        stream_mode="messages")
              if getattr(msg, "content", None) and type(msg).__name__ == "AIMessageChunk"]
    assert len(pieces) >= 3


# --- exact state values ------------------------------------------------------------------------

def scored_pairs(n: int = 24) -> list[tuple[str, str]]:
    """``n`` (question, text) pairs from the packaged corpus; every fifth text a Conclusion."""
    from tcrag_langgraph.tools.documents import PACKAGED_CORPUS, packaged_data_dir

    texts = []
    with gzip.open(packaged_data_dir() / f"{PACKAGED_CORPUS}.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if "text" in row:
                texts.append(row["text"])
            if len(texts) >= 120:
                break
    sentences = [s.strip() + "." for t in texts for s in t.split(". ") if 40 <= len(s) <= 160]
    pairs = []
    for i in range(n):
        query = f"What does the study say about {sentences[2 * i].split()[1].strip(',.').lower()}?"
        text = sentences[2 * i] if i % 2 == 0 else sentences[(7 * i + 3) % len(sentences)]
        pairs.append((query, text if i % 5 else f"Conclusion: {text}"))
    return pairs


def test_cppl_and_uct_of_24_pairs_agree_with_transformers_on_the_same_gguf(lm, llama, one_torch_thread):
    """Within 2 % of the transformers float32 reference over the same GGUF, and the same validated /
    rejected decision for all 24 at the paper's sigma and at a sigma that splits them 12/12 (50 pairs
    agreed too, in twice the time)."""
    import math

    ref = LocalLMScorer(lm)
    ours = LlamaCppScorer(model_loader=lambda: llama)  # precision="f16", the default
    pairs = scored_pairs()
    values = {m: [(ref.score(q, t, metric=m), ours.score(q, t, metric=m)) for q, t in pairs] for m in ("cppl", "uct")}
    for metric, paper_sigma in (("cppl", 10.0), ("uct", 20.0)):
        worst = max(abs(b - a) / abs(a) for a, b in values[metric])
        print(f"{metric}: max relative difference {worst:.4%}")
        assert worst < 0.02, metric
        ranked = sorted(a for a, _ in values[metric])
        half = len(ranked) // 2
        split = math.sqrt(ranked[half - 1] * ranked[half])
        for sigma in (paper_sigma, split):
            assert all((a < sigma) == (b < sigma) for a, b in values[metric]), (metric, sigma)
        assert sum(a < split for a, _ in values[metric]) == half


def test_scorer_reuses_the_query_prefix_without_changing_values(llama):
    cached = LlamaCppScorer(model_loader=lambda: llama)
    fresh = LlamaCppScorer(model_loader=lambda: llama, prefix_cache=0)
    q = "Which vitamin deficiency causes scurvy?"
    first = cached.score(q, "Vitamin C deficiency causes scurvy.", metric="cppl")
    before = cached.evaluated_tokens
    second = cached.score(q, "A lack of vitamin C.", metric="cppl")
    q_tokens = len(llama.tokenize(q + "\n"))
    assert cached.evaluated_tokens - before <= len(llama.tokenize("A lack of vitamin C.")) + 1 < q_tokens + 5
    assert first == pytest.approx(fresh.score(q, "Vitamin C deficiency causes scurvy.", metric="cppl"), rel=1e-4)
    assert second == pytest.approx(fresh.score(q, "A lack of vitamin C.", metric="cppl"), rel=1e-4)
    with pytest.raises(ValueError, match="no tokens"):
        cached.score(q, "", metric="cppl")
    with pytest.raises(ValueError, match="unknown metric"):
        cached.score(q, "x", metric="ppl")


# --- damaged and unsupported files -------------------------------------------------------------

def test_truncated_and_corrupt_files_are_clear_errors_not_crashes(tmp_path):
    src = packaged_gguf()
    truncated = tmp_path / "truncated.gguf"
    with open(src, "rb") as fin, open(truncated, "wb") as fout:
        fout.write(fin.read(src.stat().st_size // 2))
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a model at all" * 100)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(src.read_bytes()[:64])
    for path, message in ((truncated, "truncated"), (garbage, "not a GGUF file"), (header_only, "truncated or corrupt")):
        with pytest.raises(LocalModelError, match=message):
            check_gguf_file(path)
        model = resolve_chat_model(str(path))
        with pytest.raises(LocalModelError, match=message):
            model.invoke("hi")
    # The command line says so in one line and exits 2, like every user error (no traceback, no crash).
    out = subprocess.run([sys.executable, "-m", "tcrag_langgraph.faces.cli", "ask", "What is scurvy?",
                          "--model", str(truncated), "--no-tools"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "truncated" in out.stderr and "Traceback" not in out.stderr


def _without_key(src: Path, dst: Path, dropped: str) -> None:
    """A copy of a GGUF without one metadata key (everything else, tensors included, unchanged)."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(str(src))
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    writer = GGUFWriter(str(dst), arch)
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", dropped):
            continue
        vtype = fld.types[0]
        if vtype == GGUFValueType.ARRAY:
            sub = fld.types[1]
            if sub == GGUFValueType.STRING:
                value = [bytes(fld.parts[i]).decode("utf-8", "surrogateescape") for i in fld.data]
            else:
                value = [fld.parts[i].tolist()[0] for i in fld.data]
            writer.add_key_value(name, value, vtype, sub_type=sub)
        elif vtype == GGUFValueType.STRING:
            writer.add_key_value(name, bytes(fld.parts[-1]).decode("utf-8", "surrogateescape"), vtype)
        else:
            writer.add_key_value(name, fld.parts[-1].tolist()[0], vtype)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.slow
def test_a_gguf_llama_cpp_cannot_run_falls_back_to_transformers_with_one_line(tmp_path):
    """A well-formed GGUF that llama.cpp refuses (here: without the RMS-norm epsilon llama.cpp
    requires and transformers defaults) runs with transformers, generator and monitor alike."""
    path = tmp_path / "no-eps.gguf"
    _without_key(packaged_gguf(), path, "llama.attention.layer_norm_rms_epsilon")
    check_gguf_file(path)  # well-formed: not a damaged file
    script = (
        "import json\n"
        "from tcrag_langgraph.models.resolve import resolve_chat_model\n"
        "from tcrag_langgraph.monitor.own_model import scorer_for_model\n"
        f"chat = resolve_chat_model({str(path)!r}, max_new_tokens=5, temperature=0.0)\n"
        "reply = chat.invoke('Say hi')\n"
        "s = scorer_for_model(chat).score('What treats scurvy?', 'Vitamin C.', metric='cppl')\n"
        "print(json.dumps({'type': type(chat).__name__, 'backend': chat.backend, 'reply': reply.content, 's': s}))\n"
    )
    env = {**__import__("os").environ, "TCRAG_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=500, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["type"] == "LlamaCppChatModel" and result["backend"] == "transformers"
    assert result["reply"] and result["s"] > 1
    lines = [ln for ln in out.stderr.splitlines() if "running it with transformers instead" in ln]
    assert len(lines) == 1 and "llama.cpp cannot load" in lines[0]


# --- speculative decoding (the Qwen GGUFs; skipped where they are absent, as in CI) ---------------

QWEN_DIR = Path(__import__("os").environ.get("TCRAG_QWEN_DIR", "/work/models"))
QWEN_05 = QWEN_DIR / "qwen2.5-coder-0.5b-instruct.gguf"
QWEN_15 = QWEN_DIR / "qwen2.5-coder-1.5b-instruct.gguf"


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.skipif(not (QWEN_05.is_file() and QWEN_15.is_file()),
                    reason="needs the Qwen2.5-Coder 0.5B and 1.5B GGUFs (../shared/models/get_qwen.sh)")
def test_speculative_greedy_output_is_the_models_own_on_10_prompts():
    """The 0.5B drafts for the 1.5B (one tokenizer): greedy replies identical to the 1.5B alone, token
    for token, on the first 10 of the benchmark's 20 prompts (benchmarks/local_backend.py runs all 20;
    before the resync rule 6 of 20 differed); near ties were met and decided by the one-token kernels
    (resyncs: 0-8 on each of these prompts)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from local_backend import SPEC_PROMPTS

    # the machine's threads ($TCRAG_THREADS, else every core): alone in a test process (CI's two idle cores,
    # two threads took it from 103 s to 63 s on 20 prompts); set TCRAG_THREADS=1 on a machine busy with other work
    plain = LlamaCppChatModel(model_path=str(QWEN_15), temperature=0.0, kv_cache=False, max_new_tokens=24)
    spec = LlamaCppChatModel(model_path=str(QWEN_15), temperature=0.0, kv_cache=False, max_new_tokens=24,
                             draft_model_path=str(QWEN_05), n_draft=4)
    prompts = SPEC_PROMPTS[:10]
    differ = [(p, a, b) for p in prompts
              for a, b in [(plain.invoke([HumanMessage(content=p)]).content, spec.invoke([HumanMessage(content=p)]).content)]
              if a != b]
    assert differ == []
    stats = spec.speculative_stats
    print(stats.as_dict())
    assert stats.proposed > 0 and 0 < stats.accepted <= stats.proposed
    assert stats.resyncs > 0  # the rule that makes them identical was exercised, not just lucky
    # with the cache on, a plain call after speculative ones builds only on the exact part of the cache
    both = LlamaCppChatModel(model_path=str(QWEN_15), temperature=0.0, max_new_tokens=24,
                             draft_model_path=str(QWEN_05), n_draft=4)
    msgs = [HumanMessage(content=SPEC_PROMPTS[0])]
    assert both.invoke(msgs).content == plain.invoke(msgs).content
    assert both.invoke(msgs, temperature=0.5, max_new_tokens=2).content  # a sampled call: no draft
    assert both.llama_model.exact_tokens == both.llama_model.llm.n_tokens
    with pytest.raises(LocalModelError, match="one tokenizer"):
        LlamaCppChatModel(draft_model_path=str(QWEN_05), max_new_tokens=2, temperature=0.0).invoke("hi")


@pytest.mark.slow
def test_the_cli_live_view_shows_the_reply_as_it_is_written_in_a_terminal_only():
    args = [sys.executable, "-m", "tcrag_langgraph.faces.cli", "ask", "Which vitamin prevents scurvy?", "--no-tools",
            "--max-steps", "1", "--max-new-tokens", "24", "--temperature", "0", "--threads", "1"]
    env = dict(__import__("os").environ)
    env.pop("FORCE_COLOR", None)
    env.pop("TTY_INTERACTIVE", None)
    env["TERM"] = "xterm"  # the line is redrawn in place: a dumb terminal (TERM=dumb) does not get it
    piped = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**env, "TTY_COMPATIBLE": "0"})
    terminal = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**env, "TTY_COMPATIBLE": "1"})
    assert piped.returncode in (0, 1) and terminal.returncode in (0, 1), terminal.stderr[-2000:]
    assert "writing:" not in piped.stdout and "Answer:" in piped.stdout
    # token by token: the transient line is redrawn with a growing reply
    assert terminal.stdout.count("writing:") >= 3 and "Answer:" in terminal.stdout


def test_token_stats_agree_with_the_transformers_reference_on_the_same_gguf(lm, llama, one_torch_thread):
    """DRAGIN's per-token entropies from llama.cpp's logits: within 2 % of the transformers float32
    computation over the same file, the log-probs those of token_logprobs, the pieces the text."""
    query, text = "Which vitamin deficiency causes scurvy?", "Vitamin C deficiency causes scurvy in sailors."
    ours = LlamaCppScorer(model_loader=lambda: llama).token_stats(query, text)
    reference = LocalLMScorer(lm).token_stats(query, text)
    assert "".join(s.piece for s in ours) == text and len(ours) == len(reference)
    for mine, ref in zip(ours, reference):
        assert mine.entropy == pytest.approx(ref.entropy, rel=0.02, abs=0.01)
    assert [s.logprob for s in ours] == pytest.approx(LlamaCppScorer(model_loader=lambda: llama).token_logprobs(
        query, text), rel=1e-6)


# --- which weights generate ------------------------------------------------------------------------

def test_the_packaged_model_generates_with_the_float16_weights_the_monitor_scores_with(chat, llama):
    """weights="auto": the packaged model runs its float16 re-encoding (faster on CPU, RESULTS.md
    section 13) and the exact scorer uses that very model object instead of loading a second copy;
    any other GGUF runs as it is."""
    from tcrag_langgraph.models.gguf_files import f16_copy

    assert chat.generates_float16 and chat.llama_model.path == str(f16_copy(packaged_gguf()))
    assert chat.llama_model.name == packaged_gguf().stem  # named after the user's file, not the copy
    scorer = LlamaCppScorer(chat_model=chat)
    assert scorer.score("What treats scurvy?", "Vitamin C treats scurvy.", metric="cppl") > 0
    assert chat.llama_model.scoring["f16"].weights is chat.llama_model.llm._model
    # the file as it is, asked for or given by path
    as_file = LlamaCppChatModel(weights="file", n_threads=1)
    assert not as_file.generates_float16 and as_file.llama_model.path == llama.path == str(packaged_gguf().resolve())
    assert not LlamaCppChatModel(model_path=str(packaged_gguf())).generates_float16
    assert LlamaCppChatModel(model_path=str(packaged_gguf()), weights="float16").generates_float16
    with pytest.raises(ValueError, match="weights must be one of"):
        LlamaCppChatModel(weights="int4")


def test_a_damaged_file_is_refused_before_it_is_re_encoded(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + b"\0" * 64)
    with pytest.raises(LocalModelError, match="not a GGUF file"):
        load_llama_model(bad, float16=True)


def test_f16_copy_records_its_source(llama):
    from tcrag_langgraph.models.gguf_files import f16_copy

    copy = f16_copy(packaged_gguf())
    record = json.loads(copy.with_name(copy.name + ".source.json").read_text())
    assert record["path"] == str(packaged_gguf().resolve()) and record["size"] == packaged_gguf().stat().st_size


@pytest.mark.parametrize("free_mb", [100, 10**7])
def test_a_float16_copy_that_fails_on_a_full_disk_says_the_disk(tmp_path, monkeypatch, free_mb):
    """llama.cpp reports a full disk only as "code 1" (CI once ran out mid-suite): the error names the
    free space and the size the copy takes when that is the likely cause, and no other time; nothing is left."""
    import shutil

    from tcrag_langgraph.models.gguf_files import f16_copy
    from tcrag_langgraph.models.llama_cpp_native import import_llama_cpp

    monkeypatch.setenv("TCRAG_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(import_llama_cpp(), "llama_model_quantize", lambda src, dst, params: 1)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**12, 0, free_mb * 2**20))
    with pytest.raises(LocalModelError, match=r"could not write a float16 copy .* \(code 1\)") as caught:
        f16_copy(packaged_gguf())
    if free_mb == 100:
        assert "the disk is the likely cause: 100 MB free in" in str(caught.value)
        assert f"~{4 * packaged_gguf().stat().st_size // 2**20} MB" in str(caught.value)
    else:
        assert "disk" not in str(caught.value)
    assert list((tmp_path / "gguf-f16").iterdir()) == []
