#!/usr/bin/env bash
# Retrieval quality in one command: the generated set (a regression check) and the real documents
# of ../shared/corpus (the yardstick; skipped when absent). Usage: bench/eval_quality.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-/tmp/vision_rag_eval}"
mkdir -p "$out"
if [ ! -f "$out/generated/questions.jsonl" ]; then
    .venv/bin/python bench/evalset.py generate "$out/generated" --docs 40 --seed 7 --workers 2
fi
.venv/bin/python bench/eval_retrieval.py "$out/generated" --k 5 --mode hybrid --json "$out/generated.json"
.venv/bin/python bench/eval_real.py --home "$out/real_home" --json "$out/real.json"
