#!/usr/bin/env bash
# Set up, then ingest the bundled sample documents through the Dagster asset graph and search them.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/vision-rag demo
