#!/usr/bin/env bash
# The 1.5B evidence tables of issues 23 and 24, one after another, in the background; each
# `tcrag eval` resumes its run folder, so running this script again continues where it stopped
# (a session's end kills it; about 12 CPU-hours in all at one thread).
#
#   nohup nice -n 5 bash scripts/evidence_runs.sh /work/runs >> /work/runs/evidence.log 2>&1 &
#   .venv/bin/tcrag summarize /work/runs/test15         # the tables, with CIs and paired tests
#
# Every sigma comes from trainval / the calibration split, never from a test split:
#   PubMedQA: answer_prob 0.4651 (1.5B, trainval seed 3, AUROC 0.754, stored by `tcrag calibrate`);
#             cppl 73.07, uct 0.0001147 (the same sample's Youden proposals; they do not separate).
#   MedMCQA:  answer_prob 0.7691, cppl 2.013, uct 1.867 (the calibration split, 60 questions seed 0,
#             /work/runs/calmc15; none separates: AUROC 0.618 / 0.556 / 0.432).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-/work/runs}
M=${TCRAG_QWEN_DIR:-/work/models}/qwen2.5-coder-1.5b-instruct.gguf
[ -f "$M" ] || { echo "no model at $M: bash ../shared/models/get_qwen.sh 1.5b ${TCRAG_QWEN_DIR:-/work/models}" >&2; exit 2; }
export TCRAG_THREADS=${TCRAG_THREADS:-1}
COMMON=(--model "$M" --max-new-tokens 150 --temperature 0 --no-progress)

# 1. PubMedQA-L test, 200 questions: Base, SR-RAG, ReAct, TC-RAG (cppl, uct, answer_prob), w/o monitor.
.venv/bin/tcrag eval --dataset pubmedqa --split test --limit 200 --seed 0 --no-context --tools docs \
    --method sr-rag,wo-monitor,tcrag-answer,base,react,tcrag-cppl,tcrag-uct \
    --sigma answer_prob=0.4651 --sigma-cppl 73.07 --sigma-uct 0.0001147 --max-steps 8 "${COMMON[@]}" \
    --out "$RUNS/test15"

# 2. MedMCQA dev, closed book, 200 questions: Base, CoT, SR-RAG, ReAct, TC-RAG. From here on with
#    --reply-cache (table 1 started without it, and a run folder keeps its settings): the three TC-RAG
#    variants send the same prompts until their first Conclusion is judged.
.venv/bin/tcrag eval --dataset medmcqa --split dev --limit 200 --seed 0 --tools none --reply-cache \
    --method base,cot,sr-rag,react,tcrag-answer,tcrag-cppl,tcrag-uct \
    --sigma answer_prob=0.7691 --sigma-cppl 2.013 --sigma-uct 1.867 --max-steps 6 "${COMMON[@]}" \
    --out "$RUNS/mcdev15"

# 3. PubMedQA-L test, 100 of the same 200 (a subset: checked on the run folders): the adaptive baselines and
#    the ablations without Backtrack / Summary (TC-RAG cppl's, at its trainval sigma, like tcrag-cppl in 1).
#    Folder test15-adaptive2: the first attempt (test15-adaptive, code 018fcb2) was stopped after 11
#    questions when two defects showed in it (a bare "No" to the final-answer request refused; the
#    prompt line naming actions a run does not offer). Session 12 ran this from a checkout pinned at
#    de82ff6 (git worktree + its own non-editable install), so edits to main could not change it midway.
#    Session 13 split it by method into two folders run side by side (one thread each, twice the
#    throughput of one process), each started from test15-adaptive2's rows of its methods (37 questions)
#    and a copy of its reply cache; `tcrag summarize test15-adaptive2a test15-adaptive2b` joins them.
.venv/bin/tcrag eval --dataset pubmedqa --split test --limit 100 --seed 0 --no-context --tools docs --reply-cache \
    --method flare,dragin,fs-rag --sigma-cppl 73.07 --max-steps 8 "${COMMON[@]}" --out "$RUNS/test15-adaptive2a" &
.venv/bin/tcrag eval --dataset pubmedqa --split test --limit 100 --seed 0 --no-context --tools docs --reply-cache \
    --method fl-rag,self-rag,wo-backtrack,wo-summary --sigma-cppl 73.07 --max-steps 8 "${COMMON[@]}" \
    --out "$RUNS/test15-adaptive2b"
wait

# 4. PubMedQA-L test, 50 questions: the papers' other methods. Not all from the 200: random.sample draws
#    a sample of 50 another way than one of 100 or 200, so 48 of these 50 are in table 1 (and 47 in
#    table 3); `tcrag summarize` compares them on those.
.venv/bin/tcrag eval --dataset pubmedqa --split test --limit 50 --seed 0 --no-context --tools docs --reply-cache \
    --method crp-rag,kag-thinker,diffrag --max-steps 8 "${COMMON[@]}" --out "$RUNS/test15-papers"
