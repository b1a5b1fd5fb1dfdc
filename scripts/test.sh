#!/usr/bin/env bash
# Set up, then lint and run the test suite, listing its 20 slowest tests. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check vision_rag_pipeline vision_rag_pipeline_tests bench
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q --durations=20 "$@"
