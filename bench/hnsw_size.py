"""pgvector table and HNSW index size per million chunks (docs/production.md, Sizing).

    .venv/bin/python bench/hnsw_size.py [ROWS]   # default 100000; VISION_RAG_HOME picks the embedded server

Loads ROWS random 384-d unit vectors (all-MiniLM-L6-v2's dimension) with 700-character texts into a
scratch table, builds the HNSW cosine index the way pgvector_store.py does (m=16, its
`ef_construction`, in the server's `maintenance_work_mem`) and prints the table and index sizes,
scaled to a million rows.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

from vision_rag_pipeline.core.postgres import database_url
from vision_rag_pipeline.indexes.pgvector_store import _HNSW

DIM = 384


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with psycopg.connect(database_url(), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        register_vector(conn)
        conn.execute("DROP TABLE IF EXISTS sizing")
        conn.execute(
            f"CREATE TABLE sizing (id bigint PRIMARY KEY, text text, embedding vector({DIM}) NOT NULL)"
        )
        rng = np.random.default_rng(0)
        with conn.cursor().copy("COPY sizing (id, text, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(["int8", "text", "vector"])
            for i in range(rows):
                vector = rng.standard_normal(DIM).astype(np.float32)
                copy.write_row((i, "x" * 700, vector / np.linalg.norm(vector)))
        started = time.perf_counter()
        conn.execute(f"CREATE INDEX sizing_hnsw ON sizing {_HNSW}")
        build = time.perf_counter() - started
        table, index = conn.execute(
            "SELECT pg_table_size('sizing'), pg_relation_size('sizing_hnsw')"
        ).fetchone()
        conn.execute("DROP TABLE sizing")
    gib_per_million = 1e6 / rows / 2**30
    print(
        json.dumps(
            {
                "rows": rows,
                "table_bytes": table,
                "hnsw_bytes": index,
                "table_gib_per_million": round(table * gib_per_million, 2),
                "hnsw_gib_per_million": round(index * gib_per_million, 2),
                "build_seconds": round(build, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
