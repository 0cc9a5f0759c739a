"""Which answer a model gives a yes/no/maybe question before it has written anything (issue 24 item 4).

Base and SR-RAG reply in one token, so their answer is the model's next-token choice right after
the prompt. This script builds Base's prompt (its system prompt and the answer rule, through the
model's own chat template, as ``LlamaCppChatModel`` renders it) for PubMedQA-L trainval questions
and reads the probability of each answer at the first reply position (every case form summed:
``yes``, ``Yes``, `` yes``, `` Yes``), for three orders of the answers (in the system prompt's rule and
the question's last line) and with or without the
abstract in the question. If the argmax follows the order, the wording is the cause; if it stays on
one answer with the abstract there, the evidence does not reach the answer.

    python scripts/answer_prior.py --model /work/models/qwen2.5-coder-0.5b-instruct.gguf --limit 40 --seed 0

Prints, per (order, abstract) setting, the argmax answers' counts, exact matches, and the mean mass
the three answers get at that position (near 1: the model answers in one token).
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
from langchain_core.messages import HumanMessage, SystemMessage

from tcrag_langgraph.core import answer_format
from tcrag_langgraph.eval.datasets import format_question, load_dataset, sample_records
from tcrag_langgraph.methods.baselines import _SYSTEM
from tcrag_langgraph.models.llama_cpp import load_llama_model

ANSWERS = ("yes", "no", "maybe")
ORDERS = (("yes", "no", "maybe"), ("maybe", "yes", "no"), ("no", "maybe", "yes"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a GGUF file")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import llama_cpp

    lm = load_llama_model(args.model, n_ctx=4096, n_threads=args.threads)
    forms = {a: sorted({lm.tokenize(f)[0] for f in (a, a.capitalize(), " " + a, " " + a.capitalize())})
             for a in ANSWERS}
    records = sample_records(load_dataset("pubmedqa", split="trainval"), limit=args.limit, seed=args.seed)

    def first_token_probs(messages) -> dict[str, float]:
        ids = lm.prompt_ids(messages)
        lm.llm.reset()
        lm.llm.eval(ids)
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(lm.llm._ctx.ctx, -1), shape=(lm.n_vocab,))
        p = np.exp(row.astype(np.float64) - row.max())
        p /= p.sum()
        return {a: float(p[ids_].sum()) for a, ids_ in forms.items()}

    print(f"gold: {dict(Counter(r.answers[0] for r in records))} ({len(records)} trainval questions, seed {args.seed})")
    for with_abstract in (False, True):
        for order in ORDERS:
            rule = answer_format.instructions(order)  # the system prompt's rule, as Base builds it
            asked = f"Answer with {order[0]}, {order[1]} or {order[2]}."  # the question's last line
            chosen, mass = [], []
            for r in records:
                question = format_question(r, include_context=with_abstract).replace("Answer with yes, no or maybe.", asked)
                system = _SYSTEM["base"] + f" Your final answer is your Conclusion. {rule}"
                probs = first_token_probs([SystemMessage(content=system), HumanMessage(content=question)])
                chosen.append(max(probs, key=probs.get))
                mass.append(sum(probs.values()))
            right = sum(c == r.answers[0] for c, r in zip(chosen, records))
            print(f"abstract={'yes' if with_abstract else 'no ':3s} order {'/'.join(order)}: argmax {dict(Counter(chosen))}, "
                  f"EM {right}/{len(records)}, mean mass of the three answers {np.mean(mass):.3f}")


if __name__ == "__main__":
    main()
