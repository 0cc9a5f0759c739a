"""Agent step on the packaged model: stack-aligned KV cache on vs off.

A scripted 10-step TC-RAG trajectory (pushes of Thought / Tool_Use / Plan frames, a Backtrack pop,
a Summary pop+push) builds each step's prompt exactly as ``graph.py`` does (system prompt with
one tool, few-shot demonstrations, ``turn_text(render_stack(stack))``) and asks
``LocalChatModel(kv_cache=True)`` and ``LocalChatModel(kv_cache=False)`` for the next action,
greedy, interleaved. Per step it prints the prompt tokens, the tokens each variant had to prefill,
the time to the first token (a call with ``max_new_tokens=1``: prefill only) and the time of a full
step (``--new-tokens``), and whether both wrote the same tokens.

    python benchmarks/agent_step.py [--threads 1] [--new-tokens 24]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import corpus_texts, machine, parser, set_threads  # noqa: E402


def trajectory():
    """The stacks of 10 steps (after each step's stack operation) of a scripted run."""
    from tcrag_langgraph.core.state import Action, Frame, ToolCallRecord
    from tcrag_langgraph.methods.tcrag.state import pop, push, replace_top

    texts = corpus_texts(60)
    observation = " ".join(texts[10:14])[:900]
    stack = [Frame(action=Action.USER_QUERY, content="Is metformin safe for a patient with an eGFR of 25 mL/min?")]
    yield "start", stack
    stack = push(stack, Frame(action=Action.THOUGHT, content="I should check the renal dosing guidance for metformin."))
    yield "push Thought", stack
    stack = push(stack, Frame(action=Action.TOOL_USE, content="DOC_RAG", tool_call=ToolCallRecord(
        tool="DOC_RAG", tool_input="metformin renal impairment eGFR", observation=observation)))
    yield "push Tool_Use", stack
    stack = push(stack, Frame(action=Action.THOUGHT, content="The passage is about a different population."))
    yield "push Thought", stack
    stack, _ = pop(stack)
    yield "Backtrack (pop)", stack
    stack, _ = replace_top(stack, Frame(action=Action.SUMMARY, content="Retrieved passages do not address eGFR < 30."))
    yield "Summary (pop+push)", stack
    stack = push(stack, Frame(action=Action.PLAN, content="1) search the label; 2) conclude."))
    yield "push Plan", stack
    stack = push(stack, Frame(action=Action.TOOL_USE, content="DOC_RAG", tool_call=ToolCallRecord(
        tool="DOC_RAG", tool_input="metformin contraindication", observation=" ".join(texts[30:33])[:700])))
    yield "push Tool_Use", stack
    stack, _ = pop(stack)
    yield "Backtrack (pop)", stack
    stack = push(stack, Frame(action=Action.THOUGHT, content="Metformin is contraindicated below eGFR 30."))
    yield "push Thought", stack


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--new-tokens", type=int, default=24)
    args = p.parse_args()
    set_threads(args.threads)
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
    from langchain_core.tools import tool

    from tcrag_langgraph.methods.tcrag.graph import STOP_SEQUENCES
    from tcrag_langgraph.methods.tcrag.prompting import demonstrations, system_prompt, turn_text
    from tcrag_langgraph.methods.tcrag.state import render_stack
    from tcrag_langgraph.models.local import LocalChatModel

    @tool("DOC_RAG")
    def doc_rag(query: str) -> str:
        """Search 1000 PubMed abstracts for passages relevant to a query."""
        return query

    allowed = ["Thought", "Plan", "Tool_Use", "Summary", "Backtrack", "Conclusion"]
    head = [SystemMessage(content=system_prompt([doc_rag], allowed))]
    for shown, reply in demonstrations([doc_rag], allowed):
        head += [HumanMessage(content=shown), AIMessage(content=reply)]

    def messages(stack):
        return [*head, HumanMessage(content=turn_text(render_stack(stack)))]

    variants = {}
    for name, on in (("cached", True), ("plain", False)):
        variants[name] = (LocalChatModel(max_new_tokens=1, temperature=0.0, kv_cache=on),
                          LocalChatModel(max_new_tokens=args.new_tokens, temperature=0.0, kv_cache=on))
    print(f"machine: {machine()}")
    print(f"greedy, stop sequences as in graph.py, full step = up to {args.new_tokens} new tokens\n")
    print(f"{'step':>4} {'operation':<19} {'prompt':>6} {'prefill on':>10} {'prefill off':>11} "
          f"{'TTFT on':>8} {'TTFT off':>8} {'step on':>8} {'step off':>8} {'same':>5}")
    totals = {k: 0.0 for k in ("pre_on", "pre_off", "ttft_on", "ttft_off", "step_on", "step_off")}
    warm = LocalChatModel(max_new_tokens=1, temperature=0.0, kv_cache=False)
    warm.invoke(messages(next(trajectory())[1]))  # first-call costs (allocator, kernels) out of the table
    same_all = True
    for i, (op, stack) in enumerate(trajectory(), start=1):
        msgs = messages(stack)
        row = {}
        for name in ("cached", "plain"):
            first, full = variants[name]
            t0 = time.perf_counter(); r1 = first.invoke(msgs, stop=STOP_SEQUENCES); t1 = time.perf_counter()
            r2 = full.invoke(msgs, stop=STOP_SEQUENCES); t2 = time.perf_counter()
            read = r2.usage_metadata.get("input_token_details", {}).get("cache_read", 0)
            row[name] = (r2.usage_metadata["input_tokens"] - read, t1 - t0, t2 - t1, r2.content)
        same = row["cached"][3] == row["plain"][3]
        same_all &= same
        prompt = row["plain"][0]
        print(f"{i:>4} {op:<19} {prompt:>6} {row['cached'][0]:>10} {row['plain'][0]:>11} "
              f"{row['cached'][1]:>8.2f} {row['plain'][1]:>8.2f} {row['cached'][2]:>8.2f} {row['plain'][2]:>8.2f} "
              f"{'yes' if same else 'NO':>5}", flush=True)
        for key, name, idx in (("pre", "cached", 0), ("ttft", "cached", 1), ("step", "cached", 2)):
            totals[f"{key}_on"] += row[name][idx]
            totals[f"{key}_off"] += row["plain"][idx]
    print(f"\ntotals: prefill tokens {totals['pre_on']:.0f} vs {totals['pre_off']:.0f} "
          f"({totals['pre_off'] / totals['pre_on']:.1f}x fewer); "
          f"time to first token {totals['ttft_on']:.1f} s vs {totals['ttft_off']:.1f} s "
          f"({totals['ttft_off'] / totals['ttft_on']:.1f}x); "
          f"full steps {totals['step_on']:.1f} s vs {totals['step_off']:.1f} s "
          f"({totals['step_off'] / totals['step_on']:.2f}x); same greedy outputs: {same_all}")
    print("note: the 1-token and the full-step models of a variant share nothing (separate caches), so each "
          "full step also starts from the previous full step's cache")
    from transformers import StopStringCriteria

    t0 = time.perf_counter()
    StopStringCriteria(warm.local_model.tokenizer, STOP_SEQUENCES)
    print(f"building StopStringCriteria for the graph's stop sequences: {time.perf_counter() - t0:.2f} s "
          "(before issue 6 every call paid this: generate(stop_strings=...) missed transformers' cache)")
    print(f"load avg after: {machine().split('load avg ')[1].split(',')[0]}")


if __name__ == "__main__":
    main()
