#!/usr/bin/env bash
# Issue 41's runs (the papers' other systems against SR-RAG and ReAct), one command per table row set.
# Every run is `tcrag eval` with one fixed set of options (1.5B, greedy, 150 new tokens, 8 steps, no
# abstract in the prompt, the docs tool); a run folder resumes where it stopped, so the same command
# continues a run a session's end cut short. Run one at a time: with 2 cores, two llama.cpp jobs (or one
# beside the test suite) slow each other down and the s/q columns stop meaning anything.
#
#   bash scripts/issue41_runs.sh trainval crp-rag /work/runs/tv47crp     # 30 trainval q (seed 3) + SR-RAG
#   bash scripts/issue41_runs.sh test crp-rag /work/runs/test41c         # 100 test q (seed 0) + SR-RAG
#   bash scripts/issue41_runs.sh test sr-rag,react,kag-thinker /work/runs/test41
#   .venv/bin/tcrag summarize /work/runs/test41 /work/runs/test41c       # one table, paired tests
#
# LIMIT=60 takes more questions of the same seeded sample (a different limit needs a new run folder).
# TCRAG=path/to/tcrag runs another checkout's install (scripts/pin_checkout.sh pins one for a run that
# spans edits). Prompts and thresholds are chosen on trainval only; test rows are run, never tuned.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 trainval|test METHODS OUT" >&2; exit 2; }
SPLIT=$1 METHODS=$2 OUT=$3
cd "$(dirname "$0")/.."
TCRAG=${TCRAG:-.venv/bin/tcrag}
MODEL=${MODEL:-qwen2.5-coder-1.5b}  # `tcrag pull qwen2.5-coder-1.5b` first (or `make pull`)
case "$SPLIT" in
  trainval) SAMPLE=(--split trainval --limit "${LIMIT:-30}" --seed 3) ;;
  test) SAMPLE=(--split test --limit "${LIMIT:-100}" --seed 0) ;;
  *) echo "split must be trainval or test, not $SPLIT" >&2; exit 2 ;;
esac
# SR-RAG rides along (2.8 s a question) unless it is there already: every row is compared with it in one run
case ",$METHODS," in *,sr-rag,*) ;; *) METHODS="sr-rag,$METHODS" ;; esac
start=$(date +%s)
"$TCRAG" eval --dataset pubmedqa "${SAMPLE[@]}" --no-context --tools docs --method "$METHODS" --max-steps 8 \
    --model "$MODEL" --max-new-tokens 150 --temperature 0 --no-progress --out "$OUT"
echo "$OUT ($METHODS, $SPLIT): $(( $(date +%s) - start )) s" >&2
