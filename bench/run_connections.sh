#!/bin/bash
# Usage: bench/run_connections.sh [WORKDIR]   (docs/production.md, Sizing)
# Peak Postgres connections of one ingest run through the multiprocess executor (a run pod's default),
# on the production instance (Dagster storage in Postgres) + the index in Postgres.
set -e
WT=$(cd "$(dirname "$0")/.." && pwd)
B=${1:-/tmp/run_connections}
rm -rf $B; mkdir -p $B/dagster; cd $B
cp $WT/docker/dagster.yaml $B/dagster/dagster.yaml
export PYTHONPATH=$WT VISION_RAG_HOME=$B/state DAGSTER_HOME=$B/dagster HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
ADMIN=$($WT/.venv/bin/python -c "from vision_rag_pipeline.core.postgres import database_url; print(database_url())")
SOCK=$B/state/pgdata
$WT/.venv/bin/python - <<PY
import psycopg
with psycopg.connect("$ADMIN", autocommit=True) as c:
    for d in ("dagster_conn", "index_conn"):
        c.execute(f"CREATE DATABASE {d}")
PY
export PGHOST=$SOCK DAGSTER_PG_HOST= DAGSTER_PG_PORT=5432 DAGSTER_PG_USERNAME=postgres DAGSTER_PG_PASSWORD= DAGSTER_PG_DB=dagster_conn
export VISION_RAG_PG_URL="postgresql://postgres:@/index_conn?host=$SOCK"
cp $WT/vision_rag_pipeline/samples/larkspur_q3_2024_operations_review.pdf $B/doc.pdf
ID=$($WT/.venv/bin/python -c "
from vision_rag_pipeline.documents.registry import DocumentRegistry
import dagster as dg
doc = DocumentRegistry().register('$B/doc.pdf')
dg.DagsterInstance.get().add_dynamic_partitions('documents', [doc.document_id])
print(doc.document_id)" 2>/dev/null)
echo "partition $ID"
$WT/.venv/bin/python - <<PY > $B/peak.txt &
import psycopg, time, collections
peak = collections.Counter()
deadline = time.monotonic() + 400
with psycopg.connect("$ADMIN", autocommit=True) as c:
    import os
    while time.monotonic() < deadline and not os.path.exists("$B/done"):
        rows = c.execute("SELECT datname, count(*) FROM pg_stat_activity WHERE datname IN ('dagster_conn','index_conn') GROUP BY 1").fetchall()
        total = sum(n for _, n in rows)
        for d, n in rows: peak[d] = max(peak[d], n)
        peak["total"] = max(peak["total"], total)
        time.sleep(0.1)
print(dict(peak))
PY
START=$(date +%s)
$WT/.venv/bin/dagster asset materialize -m vision_rag_pipeline.definitions --select '*' --partition "$ID" > $B/run.log 2>&1 || echo "RUN FAILED"
echo "run seconds $(( $(date +%s) - START ))"
touch $B/done; wait
cat $B/peak.txt
$WT/.venv/bin/vision-rag db stop  # the embedded server this script started
