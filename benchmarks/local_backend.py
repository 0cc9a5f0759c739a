"""Local backends side by side: llama.cpp (quantized GGUF) vs transformers fp32 on the same file.

Sections (all by default; ``--section`` picks):

* ``speed``: for each GGUF, prefill and greedy decode tokens/s with llama.cpp and with transformers
  float32 (the GGUF de-quantised, as ``LocalChatModel`` runs it), and the bandwidth limit of
  decoding: the bytes of weights read per token (every tensor except a token-embedding table that
  is only looked up) over a read bandwidth measured in this run, with as many threads as decoding
  uses (torch's multi-threaded sum over a 1 GiB float32 array, median of 5). Ratios printed.
* ``agent``: the scripted 10-step TC-RAG trajectory of ``agent_step.py`` on ``LlamaCppChatModel``,
  prefix reuse on vs off: prefill tokens, time to first token, full step, same greedy output.
* ``spec``: speculative decoding, a draft GGUF for the main one (``--draft``): greedy output of 20
  prompts with and without the draft (identical?), speed-up, acceptance rate.

    nice .venv/bin/python benchmarks/local_backend.py --models /work/models/qwen2.5-coder-0.5b-instruct.gguf \\
        /work/models/qwen2.5-coder-1.5b-instruct.gguf --threads 2
    nice .venv/bin/python benchmarks/local_backend.py --section spec \\
        --models /work/models/qwen2.5-coder-1.5b-instruct.gguf --draft /work/models/qwen2.5-coder-0.5b-instruct.gguf
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import corpus_texts, machine, parser  # noqa: E402

PROMPT_TOKENS = 256


def read_bandwidth(threads: int, gib: float = 1.0) -> float:
    """Bytes/s read by a ``threads``-thread sum over a float32 array of ``gib`` GiB (median of 5)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.ones(int(gib * 2**30) // 4, dtype=torch.float32)
        x.sum()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            x.sum()
            times.append(time.perf_counter() - t0)
        return x.numel() * 4 / statistics.median(times)
    finally:
        torch.set_num_threads(before)


def weight_bytes_per_token(path: str) -> tuple[int, int]:
    """(bytes of weights read per decoded token, bytes of all tensors) of a GGUF file."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    sizes = {t.name: int(t.n_bytes) for t in reader.tensors}
    total = sum(sizes.values())
    read = total
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        read -= sizes["token_embd.weight"]  # looked up one row per token; output.weight is the matmul
    return read, total


def prompt_ids(n: int, tokenize) -> list[int]:
    text = " ".join(corpus_texts(40))
    ids = tokenize(text)
    return ids[:n]


def llama_speed(path: str, threads: int, new_tokens: int) -> dict[str, float]:
    from tcrag_langgraph.models.llama_cpp_model import load_llama_model

    lm = load_llama_model(path, n_threads=threads, n_ctx=2048)
    llm = lm.llm
    ids = prompt_ids(PROMPT_TOKENS, lambda t: lm.tokenize(t, special=False))
    llm.reset()
    llm.eval(ids[:8])  # warm-up
    prefill = []
    for _ in range(3):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(ids)
        prefill.append(time.perf_counter() - t0)
    llm.reset()
    gen = llm.generate(ids, temp=0.0, repeat_penalty=1.0, reset=True)
    next(gen)  # prefill + first token
    t0 = time.perf_counter()
    for _ in range(new_tokens):
        next(gen)
    decode = time.perf_counter() - t0
    gen.close()
    return {"prefill_tps": len(ids) / statistics.median(prefill), "decode_tps": new_tokens / decode}


def transformers_speed(path: str, threads: int, new_tokens: int) -> dict[str, float]:
    import torch

    from tcrag_langgraph.models.weights import load_local_model

    torch.set_num_threads(threads)
    lm = load_local_model(path)
    ids = prompt_ids(PROMPT_TOKENS, lambda t: lm.tokenizer(t, add_special_tokens=False)["input_ids"])
    x = torch.tensor([ids])
    with torch.no_grad():
        lm.model(x[:, :8])
        t0 = time.perf_counter()
        lm.model(x)
        prefill = time.perf_counter() - t0
        out = lm.model(x, use_cache=True)
        past = out.past_key_values
        tok = out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            out = lm.model(tok, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tok = out.logits[:, -1:].argmax(-1)
        decode = time.perf_counter() - t0
    return {"prefill_tps": len(ids) / prefill, "decode_tps": new_tokens / decode}


def section_speed(args) -> None:
    bw = read_bandwidth(args.threads)
    print(f"read bandwidth with {args.threads} threads (torch sum over 1 GiB, median of 5): {bw / 1e9:.1f} GB/s")
    for path in args.models:
        read, total = weight_bytes_per_token(path)
        limit = bw / read
        print(f"\n{Path(path).name}: tensors {total / 1e6:.0f} MB, read per token {read / 1e6:.0f} MB "
              f"-> bandwidth limit {limit:.1f} tokens/s")
        fast = llama_speed(path, args.threads, args.new_tokens)
        print(f"  llama.cpp       prefill {fast['prefill_tps']:7.1f} tok/s   decode {fast['decode_tps']:6.1f} tok/s "
              f"({limit / fast['decode_tps']:.2f}x below the limit)", flush=True)
        if args.skip_transformers:
            continue
        slow = transformers_speed(path, args.threads, max(4, args.new_tokens // 4))
        fp32_bytes = None
        try:
            from tcrag_langgraph.models.weights import load_local_model

            m = load_local_model(path).model
            fp32_bytes = sum(p.numel() * p.element_size() for p in m.parameters())
        except Exception:  # noqa: BLE001
            pass
        slow_limit = bw / fp32_bytes if fp32_bytes else float("nan")
        print(f"  transformers32  prefill {slow['prefill_tps']:7.1f} tok/s   decode {slow['decode_tps']:6.1f} tok/s "
              f"(fp32 weights {fp32_bytes / 1e9 if fp32_bytes else float('nan'):.2f} GB, limit {slow_limit:.1f} tok/s)")
        print(f"  ratio llama.cpp / transformers: decode {fast['decode_tps'] / slow['decode_tps']:.1f}x, "
              f"prefill {fast['prefill_tps'] / slow['prefill_tps']:.1f}x", flush=True)
        import gc

        from tcrag_langgraph.models import weights

        weights._load_cached.cache_clear()
        gc.collect()


def section_agent(args) -> None:
    from agent_step import trajectory
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.tools import tool

    from tcrag_langgraph.methods.tcrag.graph import STOP_SEQUENCES
    from tcrag_langgraph.methods.tcrag.prompting import demonstrations, system_prompt, turn_text
    from tcrag_langgraph.methods.tcrag.state import render_stack
    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    @tool("DOC_RAG")
    def doc_rag(query: str) -> str:
        """Search 1000 PubMed abstracts for passages relevant to a query."""
        return query

    allowed = ["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion"]
    head = [SystemMessage(content=system_prompt([doc_rag], allowed))]
    for shown, reply in demonstrations([doc_rag], allowed):
        head += [HumanMessage(content=shown), AIMessage(content=reply)]
    for path in args.models:
        print(f"\nagent step, {Path(path).name}, greedy, up to {args.step_tokens} new tokens, {args.threads} threads")
        on = LlamaCppChatModel(model_path=path, temperature=0.0, n_threads=args.threads, kv_cache=True)
        off = LlamaCppChatModel(model_path=path, temperature=0.0, n_threads=args.threads, kv_cache=False)
        print(f"{'step':>4} {'operation':<19} {'prompt':>6} {'prefill on':>10} {'prefill off':>11} "
              f"{'TTFT on':>8} {'TTFT off':>8} {'step on':>8} {'step off':>8} {'same':>5}")
        tot = dict(pre_on=0, pre_off=0, ttft_on=0.0, ttft_off=0.0, step_on=0.0, step_off=0.0)
        same_all = True
        for i, (op, stack) in enumerate(trajectory(), start=1):
            msgs = [*head, HumanMessage(content=turn_text(render_stack(stack)))]
            row = {}
            for name, chat in (("on", on), ("off", off)):
                t0 = time.perf_counter()
                stream = chat.stream(msgs, max_new_tokens=args.step_tokens, stop=STOP_SEQUENCES)
                first_at = None
                text, usage = "", {}
                for chunk in stream:
                    if first_at is None:
                        first_at = time.perf_counter()
                    text += chunk.content
                    usage = chunk.usage_metadata or usage
                end = time.perf_counter()
                read = usage.get("input_token_details", {}).get("cache_read", 0)
                row[name] = (usage["input_tokens"] - read, first_at - t0, end - t0, text, usage["input_tokens"])
            same = row["on"][3] == row["off"][3]
            same_all &= same
            print(f"{i:>4} {op:<19} {row['off'][4]:>6} {row['on'][0]:>10} {row['off'][0]:>11} {row['on'][1]:>8.2f} "
                  f"{row['off'][1]:>8.2f} {row['on'][2]:>8.2f} {row['off'][2]:>8.2f} {'yes' if same else 'NO':>5}", flush=True)
            for k, idx in (("pre", 0), ("ttft", 1), ("step", 2)):
                tot[f"{k}_on"] += row["on"][idx]
                tot[f"{k}_off"] += row["off"][idx]
        print(f"totals: prefill tokens {tot['pre_on']} vs {tot['pre_off']} ({tot['pre_off'] / max(1, tot['pre_on']):.1f}x fewer); "
              f"time to first token {tot['ttft_on']:.1f} s vs {tot['ttft_off']:.1f} s "
              f"({tot['ttft_off'] / tot['ttft_on']:.1f}x); full steps {tot['step_on']:.1f} s vs {tot['step_off']:.1f} s "
              f"({tot['step_off'] / tot['step_on']:.2f}x); same greedy outputs: {same_all}")
        print("(time to first token = until the first streamed text; the 'on' model sees the stack grow and shrink)")


SPEC_PROMPTS = [
    "Which vitamin deficiency causes scurvy?", "What is the first-line drug for type 2 diabetes?",
    "Which bacterium causes tuberculosis?", "What is the mechanism of action of aspirin?",
    "What are the symptoms of iron deficiency anemia?", "Write a Python function that reverses a string.",
    "Explain what a hash table is in two sentences.", "What does the kidney do?",
    "List three risk factors for heart disease.", "What is the normal range of adult resting heart rate?",
    "Write a SQL query that counts rows in a table named patients.", "What is insulin?",
    "Summarise the function of red blood cells.", "What causes type 1 diabetes?",
    "Write a bash command that lists files by size.", "What is an NSAID? Give two examples.",
    "How is hypertension usually treated?", "Explain recursion to a beginner.",
    "What is the difference between a virus and a bacterium?", "Name the four chambers of the heart.",
]


def section_spec(args) -> None:
    from langchain_core.messages import HumanMessage

    from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel

    if not args.draft:
        raise SystemExit("--section spec needs --draft PATH")
    target = args.models[-1]
    plain = LlamaCppChatModel(model_path=target, temperature=0.0, n_threads=args.threads, kv_cache=False)
    spec = LlamaCppChatModel(model_path=target, temperature=0.0, n_threads=args.threads, kv_cache=False,
                             draft_model_path=args.draft, n_draft=args.n_draft)
    print(f"\nspeculative decoding: {Path(target).name} with draft {Path(args.draft).name}, n_draft={args.n_draft}, "
          f"greedy, {args.spec_tokens} new tokens, {args.threads} threads")
    t_plain = t_spec = 0.0
    same = 0
    out_tokens = 0
    for prompt in SPEC_PROMPTS:
        msgs = [HumanMessage(content=prompt)]
        t0 = time.perf_counter(); a = plain.invoke(msgs, max_new_tokens=args.spec_tokens); t1 = time.perf_counter()
        b = spec.invoke(msgs, max_new_tokens=args.spec_tokens); t2 = time.perf_counter()
        t_plain += t1 - t0
        t_spec += t2 - t1
        same += a.content == b.content
        out_tokens += a.usage_metadata["output_tokens"]
        print(f"  {'same' if a.content == b.content else 'DIFFERENT'} {t1 - t0:6.2f} s vs {t2 - t1:6.2f} s  "
              f"{a.usage_metadata['output_tokens']:>3} tokens  {prompt[:50]}", flush=True)
    st = spec.speculative_stats
    print(f"identical greedy outputs: {same}/{len(SPEC_PROMPTS)}; time {t_plain:.1f} s plain vs {t_spec:.1f} s speculative "
          f"({t_plain / t_spec:.2f}x); acceptance {st.accepted}/{st.proposed} = {st.acceptance_rate:.1%}; "
          f"{out_tokens} tokens in {st.target_passes} target passes, {st.resyncs} near-tie resyncs")


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--models", nargs="+", required=True, help="GGUF files")
    p.add_argument("--section", choices=["speed", "agent", "spec", "all"], default="all")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--step-tokens", type=int, default=24)
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--draft", default=None)
    p.add_argument("--n-draft", type=int, default=4)
    p.add_argument("--spec-tokens", type=int, default=64)
    args = p.parse_args()
    if args.threads <= 0:
        args.threads = 2
    print(f"machine: {machine()}")
    if args.section in ("speed", "all"):
        section_speed(args)
    if args.section in ("agent", "all"):
        section_agent(args)
    if args.section in ("spec", "all") and args.draft:
        section_spec(args)
    print(f"load avg after: {machine().split('load avg ')[1].split(',')[0]}")


if __name__ == "__main__":
    main()
