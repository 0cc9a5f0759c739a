"""Saved key/value states of llama.cpp's generation context (tcrag_langgraph.models.llama_cpp_states),
on the packaged SmolLM2 GGUF: restored branches and prefix files give the logits of the original
prefill bit for bit, a pop then the same push is not prefilled again, and a new process loads the
fixed prompt prefix from its file (a damaged file is rebuilt). No timing here
(benchmarks/RESULTS.md section 9 measures the main job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from langchain_core.messages import HumanMessage, SystemMessage

from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
from tcrag_langgraph.models.llama_cpp_states import BranchStash, PrefixFiles, common_prefix, restore, snapshot

LONG_SYSTEM = ("You answer medical questions for clinicians. Reply with one action per turn: Thought, "
               "Tool_Use, Backtrack, Summary or Conclusion. ") * 12


def _last_logits(llm) -> np.ndarray:
    import llama_cpp

    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1), shape=(llm.n_vocab(),)).copy()


@pytest.fixture(scope="module")
def lm():
    """The model a default LlamaCppChatModel(n_threads=1) runs (the packaged model's float16 weights)."""
    return LlamaCppChatModel(n_threads=1).llama_model


def test_a_restored_sequence_gives_the_logits_of_the_original_prefill_bit_for_bit(lm):
    a = lm.tokenize("Scurvy is caused by a lack of vitamin C in the diet of sailors. " * 6)
    b = lm.tokenize("Metformin is the first-line drug for type 2 diabetes. " * 6)
    tail = lm.tokenize(" In short, the cause is")
    with lm.lock:
        llm = lm.llm
        llm.reset()
        llm.eval(a)
        saved = snapshot(llm, len(a))
        llm.eval(tail)
        direct = _last_logits(llm)
        llm.n_tokens = 0
        llm.eval(b)  # another branch overwrites the cache
        restore(llm, saved)
        assert llm.n_tokens == len(a) and list(llm.input_ids[:len(a)]) == a
        llm.eval(tail)
        np.testing.assert_array_equal(_last_logits(llm), direct)
        llm.reset()
        lm.exact_tokens = 0


def test_a_pop_then_the_same_push_is_not_prefilled_again(lm):
    """Backtrack drops a long observation, the model runs the same search again: the second push
    comes from the stash, not from a prefill (without the stash it is prefilled again)."""
    observation = "Observation: " + "Vitamin C deficiency impairs collagen synthesis and causes scurvy. " * 8

    def turns(*frames):
        return [SystemMessage(content="One action per turn."),
                HumanMessage(content="User_Query: What causes scurvy?\n" + "\n".join(frames) + "\nWrite your next action.")]

    pushed = turns("Tool_Use: DOC_RAG scurvy", observation)
    popped = turns("Thought: that was not it")
    reads = {}
    for stash_bytes in (48 << 20, 0):
        with lm.lock:
            lm.llm.reset()
            lm.exact_tokens = 0
            lm.branches = BranchStash(max_bytes=stash_bytes)
        chat = LlamaCppChatModel(max_new_tokens=2, temperature=0.0, n_threads=1, prompt_files=False)
        chat.invoke(pushed)
        chat.invoke(popped)
        again = chat.invoke(pushed)
        reads[stash_bytes] = again.usage_metadata["input_token_details"]["cache_read"]
    pushed_ids = lm.prompt_ids(pushed)
    shared = common_prefix(pushed_ids, lm.prompt_ids(popped))
    assert reads[48 << 20] >= len(pushed_ids) - 1  # everything but the last token (re-evaluated for its logits)
    assert reads[0] <= shared  # without the stash only the shared prefix survives the pop
    assert len(pushed_ids) - shared > 100
    lm.branches = BranchStash()


_PROCESS = r"""
import json, sys
from langchain_core.messages import HumanMessage, SystemMessage
from tcrag_langgraph.models.llama_cpp import LlamaCppChatModel
chat = LlamaCppChatModel(max_new_tokens=12, temperature=0.0, n_threads=1)
msgs = [SystemMessage(content=sys.argv[1]), HumanMessage(content="Which vitamin deficiency causes scurvy?")]
reply = chat.invoke(msgs)
print(json.dumps({"text": reply.content, "read": reply.usage_metadata["input_token_details"]["cache_read"],
                  "prompt": reply.usage_metadata["input_tokens"]}))
"""


@pytest.mark.slow
def test_a_new_process_loads_the_fixed_prompt_prefix_from_its_file(tmp_path):
    env = {**os.environ, "TCRAG_CACHE_DIR": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}

    def run() -> dict:
        out = subprocess.run([sys.executable, "-c", _PROCESS, LONG_SYSTEM], capture_output=True, text=True, env=env,
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    cold = run()
    files = list((tmp_path / "cache" / "llama-states").glob("*/*.kv"))
    assert len(files) == 1 and cold["read"] == 0  # computed here, not read
    warm = run()
    assert warm["read"] >= 256 and warm["prompt"] - warm["read"] < 40  # the system prompt came from the file
    assert warm["text"] == cold["text"]  # the same key/value bytes, so the same greedy reply
    files[0].write_bytes(files[0].read_bytes()[:1000])  # damaged: not loaded, rebuilt
    again = run()
    assert again["text"] == cold["text"] and again["read"] == 0
    assert files[0].stat().st_size > 1000


def test_prefix_files_refuse_bad_settings_and_skip_short_prefixes(tmp_path, lm):
    with pytest.raises(ValueError):
        PrefixFiles(tmp_path, min_tokens=0)
    with pytest.raises(ValueError):
        BranchStash(min_tokens=0)
    files = PrefixFiles(tmp_path, min_tokens=256)
    with lm.lock:
        assert files.ensure(lm.llm, lm.path, lm.tokenize("short prefix")) is None
    assert not any(Path(tmp_path).rglob("*.kv"))
