-- Runs once, on an empty data volume: the index database (pgvector) beside the Dagster database
-- that POSTGRES_DB creates. Both belong to POSTGRES_USER.
CREATE DATABASE vision_rag;
\connect vision_rag
CREATE EXTENSION IF NOT EXISTS vector;
