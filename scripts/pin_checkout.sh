#!/usr/bin/env bash
# A checkout of COMMIT at DIR with its own non-editable install, for an evaluation that runs for
# hours or across sessions: the repository's editable install reads prompts/ and the code on every
# call, so an edit in the middle of a run would change the run. DIR's environment borrows the
# repository's installed dependencies (a .pth line) and installs only this package, from COMMIT.
#
#   bash scripts/pin_checkout.sh HEAD /work/evalpin
#   cd /work/evalpin && .venv/bin/tcrag eval ... --out /work/runs/NAME
#
# Every row then records the same code_version (tcrag_langgraph.eval.provenance).
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 COMMIT DIR" >&2; exit 2; }
COMMIT=$1
DIR=$2
cd "$(dirname "$0")/.."
[ ! -e "$DIR" ] || { echo "$DIR exists; give a new folder" >&2; exit 2; }
SITE=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
PY=$(.venv/bin/python -c 'import sys; print(sys._base_executable)')
git worktree add --detach "$DIR" "$COMMIT"
"$PY" -m venv "$DIR/.venv"
PIN_SITE=$("$DIR/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$SITE" > "$PIN_SITE/repository_dependencies.pth"
"$DIR/.venv/bin/python" -m pip install -q --no-deps "$DIR"
# from another folder, so the checkout's own source tree does not shadow the installed copy
(cd / && "$DIR/.venv/bin/python" -c 'import tcrag_langgraph.eval.provenance as p; print("pinned", p.code_version(), "at", p.__file__)')
