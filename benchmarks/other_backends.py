"""Other CPU backends side by side with llama.cpp: OpenVINO (optimum-intel) and onnxruntime-genai.

Issue 20 item 1 named three candidates for a native quantized CPU backend: llama-cpp-python (chosen,
`local_backend.py`), OpenVINO with optimum-intel and onnxruntime-genai. The two others cannot read a
GGUF: they run their own export of a transformers folder, re-quantized to their own int4/int8. This
script measures them against llama.cpp on the user's GGUF in one run:

* **speed**: each backend in its own fresh process, interleaved (llama.cpp, then each candidate, then
  again), ``--repeats`` rounds per thread count, medians printed with ratios to llama.cpp. The same
  ``--prompt-tokens`` token ids for all (PubMed text of the packaged corpus, tokenized once by the
  GGUF's tokenizer), an untimed warm-up of 8 tokens, then one timed greedy generation of
  ``--new-tokens`` + 1 tokens: prefill = time to the first new token, decode = the tokens after the
  first over their time. Peak RSS of the process (``ru_maxrss``: libraries, weights, mapped files)
  and the load time (load + compile) are printed too, and how many leading greedy tokens equal
  llama.cpp's.
* **logprobs**: log P of each token of a short answer after a question, teacher-forced in one pass,
  on the token sequence the package's ``LlamaCppScorer`` scores (start token, ``context + "\\n"``,
  the text), from: transformers float32 over the transformers folder (``--reference``: the GGUF
  de-quantized, i.e. the GGUF's own weight values: the reference), llama.cpp ``LlamaCppScorer``
  with ``precision="native"`` and ``"f16"``, and each candidate (OpenVINO with its CPU defaults and
  with f32 inference / f32 KV cache / no dynamic quantization). Candidates run *other weights*
  (their int4/int8 re-quantization of the de-quantized GGUF), so their difference is that of the
  weights and of the kernels together.

Candidates are skipped with a printed line when ``--candidate-python`` is not given or a folder is
missing. The candidates live in their own virtual environment (optimum-intel pins transformers 5.5
and needs torch; the project's ``.venv`` is left as it is); llama.cpp runs with the project's Python.

Setting up (2026-11-25; no weights are downloaded, everything is made from the local GGUF)::

    python3 -m venv /work/exp/ovenv
    /work/exp/ovenv/bin/pip install "optimum-intel[openvino]==2.2.0" openvino==2026.4.1 \\
        onnxruntime-genai==0.18.0 nncf gguf accelerate onnx onnx_ir
    # transformers folder from the GGUF (de-quantized to float32; the GGUF's tokenizer)
    /work/exp/ovenv/bin/python - <<'EOF'
    from transformers import AutoModelForCausalLM, AutoTokenizer
    d, f = "/work/models", "qwen2.5-coder-0.5b-instruct.gguf"
    AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype="float32").save_pretrained("/work/exp/hf-qwen05")
    AutoTokenizer.from_pretrained(d, gguf_file=f).save_pretrained("/work/exp/hf-qwen05")
    EOF
    # OpenVINO IR, int4 (NNCF defaults: int4 asym group 128, embeddings and lm_head int8) and int8
    /work/exp/ovenv/bin/optimum-cli export openvino -m /work/exp/hf-qwen05 --task text-generation-with-past \\
        --weight-format int4 /work/exp/ov-qwen05-int4
    /work/exp/ovenv/bin/optimum-cli export openvino -m /work/exp/hf-qwen05 --task text-generation-with-past \\
        --weight-format int8 /work/exp/ov-qwen05-int8
    # onnxruntime-genai, int4 for the CPU (MatMulNBits, block 32, accuracy level 4)
    /work/exp/ovenv/bin/python -m onnxruntime_genai.models.builder -i /work/exp/hf-qwen05 \\
        -o /work/exp/ort-qwen05-int4 -p int4 -e cpu -c /work/exp/ort-cache

The 1.5B (``qwen2.5-coder-1.5b-instruct.gguf``): the same commands with ``hf-qwen15``, ``ov-qwen15-int4``,
``ov-qwen15-int8`` and ``ort-qwen15-int4`` (the float32 folder is 7.1 GB; the ORT builder peaked at 17 GB RSS).

Running (the driver and llama.cpp with the project's Python)::

    nice .venv/bin/python benchmarks/other_backends.py --gguf /work/models/qwen2.5-coder-0.5b-instruct.gguf \\
        --candidate-python /work/exp/ovenv/bin/python --openvino /work/exp/ov-qwen05-int4 /work/exp/ov-qwen05-int8 \\
        --ortgenai /work/exp/ort-qwen05-int4 --reference /work/exp/hf-qwen05 --threads 1 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
WARMUP_TOKENS = 8
#: The log-prob check: log P(TEXT | CONTEXT), the form of TC-RAG's state values.
CONTEXT = "Question: Which vitamin deficiency causes scurvy, and what are its first signs?"
TEXT = "Answer: Scurvy is caused by a lack of vitamin C; the first signs are tiredness and bleeding gums."
#: OpenVINO CPU properties for the exact variant of the log-prob check (the defaults on a CPU with
#: AVX512-BF16 are bf16 inference, a u8 KV cache and 8-bit dynamic quantization of activations).
OV_EXACT = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}


# ----------------------------------------------------------------------------------------------
# Workers: each runs in its own process and prints one line "RESULT <json>".
# ----------------------------------------------------------------------------------------------

def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _emit(result: dict) -> None:
    result["peak_rss_mb"] = _peak_rss_mb()
    print("RESULT " + json.dumps(result), flush=True)


def worker_prepare(a) -> None:
    """Token ids every backend gets: the speed prompt and the scorer's sequence for the log-prob check."""
    sys.path.insert(0, str(HERE.parent))
    from _common import corpus_texts

    from tcrag_langgraph.models.llama_cpp_model import load_llama_model

    lm = load_llama_model(a.model, n_threads=1, n_ctx=512)
    prompt = lm.tokenize(" ".join(corpus_texts(40)), special=False)[: a.prompt_tokens]
    start = next(([t] for t in (lm.bos_id, lm.eos_id) if t is not None), [])
    ctx = lm.tokenize(CONTEXT + "\n", special=True)
    text = lm.tokenize(TEXT, special=True)
    _emit({"prompt_ids": prompt, "score_ids": start + ctx + text, "first": len(start) + len(ctx),
           "text_pieces": [lm.detokenize([t]) for t in text]})


def worker_llama(a, ids: dict) -> None:
    t0 = time.perf_counter()
    from tcrag_langgraph.models.llama_cpp_model import load_llama_model

    if a.logprobs:
        from tcrag_langgraph.monitor.llama_cpp import LlamaCppScorer

        out = {}
        for precision in ("native", "f16"):
            scorer = LlamaCppScorer(model_path=a.model, n_threads=a.threads, precision=precision)
            rows, targets = scorer._scored_rows(CONTEXT, TEXT)
            seq = ids["score_ids"]
            if targets != seq[ids["first"]:]:
                raise SystemExit("LlamaCppScorer scored other token ids than the prepared ones")
            out[precision] = scorer.token_logprobs(CONTEXT, TEXT)
        _emit({"logprobs": out})
        return
    lm = load_llama_model(a.model, n_threads=a.threads, n_ctx=2048)
    llm = lm.llm
    prompt = ids["prompt_ids"]
    llm.reset()
    llm.eval(prompt[:WARMUP_TOKENS])
    llm.reset()
    load_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    gen = llm.generate(prompt, temp=0.0, repeat_penalty=1.0, reset=True)
    tokens = [next(gen)]
    t1 = time.perf_counter()
    for _ in range(a.new_tokens):
        tokens.append(next(gen))
    t2 = time.perf_counter()
    gen.close()
    _emit({"load_s": load_s, "prefill_s": t1 - t0, "decode_s": t2 - t1, "decoded": len(tokens) - 1,
           "tokens": tokens, "info": f"llama.cpp n_threads={a.threads} (n_threads_batch too), GGUF as is"})


def _ov_model(a, exact: bool):
    import torch
    from optimum.intel import OVModelForCausalLM

    torch.set_num_threads(a.threads)
    config = {"INFERENCE_NUM_THREADS": a.threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "CACHE_DIR": ""}
    if exact:
        config.update(OV_EXACT)
    model = OVModelForCausalLM.from_pretrained(a.model, ov_config=config, device="CPU")
    compiled = model.request.get_compiled_model()
    props = {k: str(compiled.get_property(k)) for k in
             ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION", "DYNAMIC_QUANTIZATION_GROUP_SIZE", "INFERENCE_NUM_THREADS")}
    return model, props


def worker_openvino(a, ids: dict) -> None:
    t0 = time.perf_counter()
    import torch

    if a.logprobs:
        out, info = {}, {}
        for name, exact in (("default", False), ("f32", True)):
            model, props = _ov_model(a, exact)
            seq = torch.tensor([ids["score_ids"]])
            with torch.no_grad():
                logits = model(input_ids=seq, attention_mask=torch.ones_like(seq)).logits[0].double()
            out[name] = _logprobs_from_rows(logits.numpy(), ids)
            info[name] = props
            del model
        _emit({"logprobs": out, "info": json.dumps(info)})
        return
    model, props = _ov_model(a, exact=False)
    prompt = torch.tensor([ids["prompt_ids"]])

    class Clock:  # a transformers streamer: put() gets the prompt once, then each new token
        def __init__(self):
            self.times, self.tokens, self.seen_prompt = [], [], False

        def put(self, value):
            if not self.seen_prompt:
                self.seen_prompt = True
                return
            self.times.append(time.perf_counter())
            self.tokens.extend(int(x) for x in value.flatten())

        def end(self):
            pass

    gen_args = dict(do_sample=False, pad_token_id=model.config.eos_token_id if model.config.pad_token_id is None
                    else model.config.pad_token_id)
    with torch.no_grad():
        w = prompt[:, :WARMUP_TOKENS]
        model.generate(w, attention_mask=torch.ones_like(w), max_new_tokens=2, min_new_tokens=2, **gen_args)
        load_s = time.perf_counter() - t0
        clock = Clock()
        t0 = time.perf_counter()
        model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=a.new_tokens + 1,
                       min_new_tokens=a.new_tokens + 1, streamer=clock, **gen_args)
    _emit({"load_s": load_s, "prefill_s": clock.times[0] - t0, "decode_s": clock.times[-1] - clock.times[0],
           "decoded": len(clock.times) - 1, "tokens": clock.tokens,
           "info": "optimum-intel OVModelForCausalLM.generate, " + json.dumps(props)})


def _ort_model(a):
    import onnxruntime_genai as og

    config = og.Config(a.model)
    config.overlay(json.dumps({"model": {"decoder": {"session_options": {
        "intra_op_num_threads": a.threads, "inter_op_num_threads": 1}}}}))
    return og, og.Model(config)


def worker_ortgenai(a, ids: dict) -> None:
    t0 = time.perf_counter()
    og, model = _ort_model(a)

    def generator(n_prompt: int, n_new: int):
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=n_prompt + n_new, min_length=n_prompt + n_new)
        return og.Generator(model, params)

    if a.logprobs:
        import numpy as np

        seq = ids["score_ids"]
        g = generator(len(seq), 1)
        g.append_tokens(seq)
        rows = np.asarray(g.get_output("logits"))[0].astype(np.float64)
        _emit({"logprobs": {"default": _logprobs_from_rows(rows, ids)}})
        return
    prompt = ids["prompt_ids"]
    g = generator(WARMUP_TOKENS, 2)
    g.append_tokens(prompt[:WARMUP_TOKENS])
    g.generate_next_token()
    g.generate_next_token()
    del g
    load_s = time.perf_counter() - t0
    g = generator(len(prompt), a.new_tokens + 1)
    t0 = time.perf_counter()
    g.append_tokens(prompt)  # runs the prompt; the first generate_next_token only picks from its logits
    g.generate_next_token()
    tokens = [int(g.get_next_tokens()[0])]
    t1 = time.perf_counter()
    for _ in range(a.new_tokens):
        g.generate_next_token()
        tokens.append(int(g.get_next_tokens()[0]))
    t2 = time.perf_counter()
    _emit({"load_s": load_s, "prefill_s": t1 - t0, "decode_s": t2 - t1, "decoded": len(tokens) - 1,
           "tokens": tokens, "info": f"onnxruntime-genai Generator, intra_op_num_threads={a.threads}"})


def worker_transformers(a, ids: dict) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(a.threads)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    seq = torch.tensor([ids["score_ids"]])
    with torch.no_grad():
        logits = model(seq).logits[0].double()
    _emit({"logprobs": {"fp32": _logprobs_from_rows(logits.numpy(), ids)}})


def _logprobs_from_rows(rows, ids: dict) -> list[float]:
    """log P of score_ids[first:] from the logit rows of the whole sequence (row i predicts token i+1)."""
    import numpy as np

    seq, first = ids["score_ids"], ids["first"]
    out = []
    for pos in range(first, len(seq)):
        row = np.asarray(rows[pos - 1], dtype=np.float64)
        m = row.max()
        out.append(float(row[seq[pos]] - m - np.log(np.exp(row - m).sum())))
    return out


WORKERS = {"llama": worker_llama, "openvino": worker_openvino, "ortgenai": worker_ortgenai,
           "transformers": worker_transformers}


# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------

def _size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _run(python: str, kind: str, model: str, ids_file: str, threads: int, new_tokens: int,
         logprobs: bool = False, prompt_tokens: int = 256) -> dict:
    cmd = [python, str(HERE), "--worker", kind, "--model", model, "--ids", ids_file, "--threads", str(threads),
           "--new-tokens", str(new_tokens), "--prompt-tokens", str(prompt_tokens)]
    if logprobs:
        cmd.append("--logprobs")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
    return {"error": f"exit {proc.returncode}: " + "\n    ".join(tail)}


def _lead(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", help="the GGUF file (llama.cpp runs it as is)")
    p.add_argument("--llama-python", default=sys.executable,
                   help="Python with tcrag_langgraph and llama-cpp-python (default: this one)")
    p.add_argument("--candidate-python", help="Python with optimum-intel, openvino and onnxruntime-genai")
    p.add_argument("--openvino", nargs="*", default=[], help="OpenVINO IR folders (optimum-cli export openvino)")
    p.add_argument("--ortgenai", nargs="*", default=[], help="onnxruntime-genai model folders (its builder)")
    p.add_argument("--reference", help="the transformers folder made from the GGUF (float32 reference for log-probs)")
    p.add_argument("--threads", type=int, nargs="+", default=[1], help="thread counts, each for every backend")
    p.add_argument("--repeats", type=int, default=3, help="rounds of fresh processes per thread count")
    p.add_argument("--new-tokens", type=int, default=48, help="decoded tokens timed after the first")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--skip-speed", action="store_true")
    p.add_argument("--skip-logprobs", action="store_true")
    # worker mode (internal)
    p.add_argument("--worker", choices=["prepare", *WORKERS], help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--ids", help=argparse.SUPPRESS)
    p.add_argument("--logprobs", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args()

    if a.worker:
        a.threads = a.threads[0]
        if a.worker == "prepare":
            worker_prepare(a)
        else:
            WORKERS[a.worker](a, json.loads(Path(a.ids).read_text()))
        return
    if not a.gguf:
        p.error("--gguf is required")

    backends = [("llama.cpp", "llama", a.llama_python, a.gguf)]
    candidates = [("openvino", d) for d in a.openvino] + [("ortgenai", d) for d in a.ortgenai]
    if not a.openvino:
        print("OpenVINO: skipped (no --openvino folder given)")
    if not a.ortgenai:
        print("onnxruntime-genai: skipped (no --ortgenai folder given)")
    for kind, folder in candidates:
        label = f"{'OpenVINO' if kind == 'openvino' else 'ORT-genai'} {Path(folder).name}"
        if not a.candidate_python or not Path(a.candidate_python).exists():
            print(f"{label}: skipped (no --candidate-python, or it does not exist)")
        elif not Path(folder).is_dir():
            print(f"{label}: skipped ({folder} is not a folder)")
        else:
            backends.append((label, kind, a.candidate_python, folder))

    print(f"machine: {os.cpu_count()} cores, load avg {_load()} at the start")
    print(f"GGUF: {a.gguf}")
    for label, _kind, python, model in backends:
        print(f"  {label:<28} {_size_mb(Path(model)):8.0f} MB on disk  ({model}; {python})")

    import tempfile

    prep = _run(a.llama_python, "prepare", a.gguf, "", 1, a.new_tokens, prompt_tokens=a.prompt_tokens)
    if "error" in prep:
        raise SystemExit(f"cannot tokenize with the GGUF: {prep['error']}")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(prep, fh)
        ids_file = fh.name
    print(f"prompt: {len(prep['prompt_ids'])} tokens of PubMed text; greedy, {a.new_tokens} decoded tokens timed "
          f"after the first; each run a fresh process")

    if not a.skip_speed:
        for threads in a.threads:
            runs: dict[str, list[dict]] = {b[0]: [] for b in backends}
            print(f"\n== {threads} thread(s) ==")
            for r in range(a.repeats):
                for label, kind, python, model in backends:
                    before = _load()
                    res = _run(python, kind, model, ids_file, threads, a.new_tokens, prompt_tokens=a.prompt_tokens)
                    if "error" in res:
                        print(f"  round {r + 1} {label}: FAILED {res['error']}", flush=True)
                        continue
                    res["prefill_tps"] = len(prep["prompt_ids"]) / res["prefill_s"]
                    res["decode_tps"] = res["decoded"] / res["decode_s"]
                    res["load_before"] = before
                    runs[label].append(res)
                    print(f"  round {r + 1} {label:<28} prefill {res['prefill_tps']:7.1f} tok/s  decode "
                          f"{res['decode_tps']:6.1f} tok/s  peak RSS {res['peak_rss_mb']:6.0f} MB  load "
                          f"{res['load_s']:5.1f} s  (load avg {before})", flush=True)
            base = runs["llama.cpp"]
            base_tokens = base[0]["tokens"] if base else []
            med = {k: {m: statistics.median(x[m] for x in v) for m in ("prefill_tps", "decode_tps", "peak_rss_mb",
                                                                       "load_s")} for k, v in runs.items() if v}
            print(f"\nmedians of {a.repeats} rounds, {threads} thread(s), load avg {_load()} at the end:")
            print(f"| backend | disk MB | prefill tok/s | decode tok/s | peak RSS MB | load s | prefill vs llama.cpp "
                  f"| decode vs llama.cpp | greedy tokens = llama.cpp's |")
            print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
            for label, _kind, _python, model in backends:
                if label not in med:
                    print(f"| {label} | failed | | | | | | | |")
                    continue
                m = med[label]
                ref = med.get("llama.cpp")
                pr = f"{m['prefill_tps'] / ref['prefill_tps']:.2f}x" if ref else "-"
                dr = f"{m['decode_tps'] / ref['decode_tps']:.2f}x" if ref else "-"
                lead = _lead(runs[label][0]["tokens"], base_tokens) if base_tokens else 0
                print(f"| {label} | {_size_mb(Path(model)):.0f} | {m['prefill_tps']:.1f} | {m['decode_tps']:.1f} | "
                      f"{m['peak_rss_mb']:.0f} | {m['load_s']:.1f} | {pr} | {dr} | "
                      f"first {lead} of {len(runs[label][0]['tokens'])} |")
            for label in med:
                print(f"  {label}: {runs[label][0].get('info', '')}")

    if not a.skip_logprobs:
        print(f"\nlog-prob check: log P(text | context), {len(prep['score_ids']) - prep['first']} tokens, "
              f"teacher-forced, one thread")
        print(f"  context: {CONTEXT!r}\n  text:    {TEXT!r}")
        rows: list[tuple[str, list[float]]] = []
        jobs = [("transformers fp32 (GGUF de-quantized)", "transformers", a.candidate_python, a.reference)] \
            if a.reference and a.candidate_python else []
        jobs += [(label, kind, python, model) for label, kind, python, model in backends]
        for label, kind, python, model in jobs:
            res = _run(python, kind, model, ids_file, 1, a.new_tokens, logprobs=True)
            if "error" in res:
                print(f"  {label}: FAILED {res['error']}")
                continue
            for variant, values in res["logprobs"].items():
                rows.append((f"{label} [{variant}]", values))
            if res.get("info"):
                print(f"  {label}: {res['info']}")
        if rows:
            ref_label, ref = rows[0]
            print(f"\n| scorer | sum log P | diff vs {ref_label} | mean abs diff per token | max abs diff |")
            print("|---|---:|---:|---:|---:|")
            for label, values in rows:
                diffs = [abs(x - y) for x, y in zip(values, ref)]
                print(f"| {label} | {sum(values):.3f} | {sum(values) - sum(ref):+.3f} | "
                      f"{statistics.mean(diffs):.3f} | {max(diffs):.3f} |")
            print("  per token: " + " | ".join(f"{piece!r}" for piece in prep["text_pieces"]))
            for label, values in rows:
                print(f"  {label}: " + " ".join(f"{v:.2f}" for v in values))
    os.unlink(ids_file)


if __name__ == "__main__":
    main()
