#!/usr/bin/env bash
# Set up, then lint and run the test suite, listing its 20 slowest tests. Extra arguments go to pytest.
# Two pytest workers (VISION_RAG_TEST_WORKERS; 0 runs in this process), a test module each at a
# time: much of the suite waits on real processes (a daemon's ticks, a killed worker's hand-over),
# and the other worker uses the cores meanwhile. Modules in conftest's order (the slow ones first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check vision_rag_pipeline vision_rag_pipeline_tests bench
.venv/bin/lint-imports --no-cache
exec .venv/bin/python -m pytest -q -n "${VISION_RAG_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
  --durations=20 "$@"
