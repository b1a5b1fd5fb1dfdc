"""A daemon-launched ingest against the CLI's, on the same new files: one file, and many dropped at once.

    PYTHONPATH=$PWD .venv/bin/python bench/bench_daemon.py [--files 1 20] [--rounds 3] \
        [--executor default|multiprocess|forkserver|in_process] [--max-batch N] \
        [--work /tmp/bench_daemon]

Starts one embedded Postgres with a database per path, and a real `dagster-daemon` (its own code
server, Dagster's default run launcher: a process per run) watching an inbox, on the project's local
instance as `vision-rag` writes it. Each round writes N new scanned-style PDFs (a paragraph and a bar
chart with random figures, so no cache knows them), times `vision-rag ingest` on them (the whole
process, into a home where Postgres runs and the Dagster instance exists), then moves the same files
into the inbox: the inbox sensor requests them, the ingest_requests sensor makes runs of batches of
them. Timed: the daemon's runs from the first run's creation to the last run's end (what the daemon
path costs), and apart the sensors' latency (drop to first run created) and drop to every file
recorded ingested (what a user waits).

`--executor default` is the project's code location as users run it; the others load
bench/daemon_executors.py, the same definitions under another Dagster executor. `--max-batch 1`
makes one run per document (`VISION_RAG_MAX_BATCH`, as before batches). A round's ratio is daemon /
CLI on the same files; the medians of the rounds are printed as JSON at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SENSOR_SECONDS = 5  # every sensor (version_sensor too): not counted, but its ticks cost CPU
RUN_TIMEOUT = 900


def write_scan(path: Path, rng: random.Random) -> None:
    """A one-page PDF of a rendered page (a paragraph and a bar chart): one image, OCR'd, two chunks."""
    from PIL import Image, ImageDraw, ImageFont

    values = [round(rng.uniform(10, 90), 1) for _ in range(4)]
    page = Image.new("RGB", (850, 1100), "white")
    draw = ImageDraw.Draw(page)
    font = ImageFont.truetype("DejaVuSans.ttf", 18)
    lines = (
        f"Delivery note {rng.randint(10**5, 10**6)}: parcels sorted in four depots.",
        f"The busiest depot sorted {max(values)} thousand parcels this week.",
    )
    for row, line in enumerate(lines):
        draw.text((72, 72 + 28 * row), line, fill="black", font=font)
    draw.text((200, 280), f"Parcels per depot, week {rng.randint(1, 52)}", fill="black", font=font)
    for i, value in enumerate(values):
        x = 120 + i * 160
        draw.rectangle([x, 700 - value * 4, x + 90, 700], fill=(160, 60, 40))
        draw.text((x + 15, 672 - value * 4), f"{value}", fill="black", font=font)
        draw.text((x + 5, 708), f"Depot {i + 1}", fill="black", font=font)
    page.save(path, "PDF", resolution=100)


def create_database(admin_url: str, name: str) -> str:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return make_conninfo(**(conninfo_to_dict(admin_url) | {"dbname": name}))


def path_env(home: Path, database_url: str, **extra: str) -> dict[str, str]:
    env = os.environ | {
        "PYTHONPATH": str(REPO),
        "VISION_RAG_HOME": str(home),
        "DAGSTER_HOME": str(home / "dagster"),
        "VISION_RAG_PG_URL": database_url,
        **extra,
    }
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "AZURE_OPENAI_API_KEY", "VISION_RAG_CONFIG"):
        env.pop(name, None)
    return env


def tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its descendants, those still running and those it reaped."""
    import psutil

    total = 0.0
    try:
        root = psutil.Process(pid)
        for process in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = process.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
    except psutil.NoSuchProcess:
        pass
    return total


def cli_ingest(files: list[Path], env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of `vision-rag ingest FILES --json` (with its workers), as a user runs it."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "vision_rag_pipeline.cli", "ingest", *map(str, files), "--json"],
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
    )
    seconds = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    if done.returncode or report.get("documents") != len(files):
        sys.exit(f"CLI ingest failed ({done.returncode}): {done.stderr[-2000:]}")
    return seconds, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


class Daemon:
    """`dagster-daemon run` on a code location, in its own process group (stopped with everything it
    started: code server, run workers)."""

    def __init__(self, executor: str, env: dict[str, str], log: Path) -> None:
        import dagster as dg

        target = (
            ["-m", "vision_rag_pipeline.definitions"]
            if executor == "default"
            else ["-f", str(REPO / "bench" / "daemon_executors.py")]
        )
        if executor != "default":
            env = env | {"BENCH_EXECUTOR": executor}
        self.log = log
        self.database = env["VISION_RAG_PG_URL"]
        # the storages are created here, before the daemon opens them: two processes migrating a new
        # SQLite home at once break it ("table alembic_version already exists")
        self.instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(Path(sys.executable).parent / "dagster-daemon"), "run", *target],
                cwd=log.parent,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )

    def stop(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGINT)
            self.process.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def states(self, paths: list[str]) -> dict[str, str | None]:
        import psycopg

        with psycopg.connect(self.database) as conn:
            rows = conn.execute(
                "SELECT abs_path, state FROM documents WHERE abs_path = ANY(%s)", (paths,)
            ).fetchall()
        return dict(rows)

    def ingest(self, files: list[Path], inbox: Path) -> dict[str, float]:
        """Move the files into the inbox at once; wait until each is recorded ingested; the timings of
        the runs the ingest_requests sensor made since."""
        import dagster as dg

        moved = [str(inbox / f.name) for f in files]
        for f in files:  # renames inside one file system: each file appears whole
            f.rename(inbox / f.name)
        cpu_before = tree_cpu(self.process.pid)
        dropped = time.time()
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            states = self.states(moved)
            if "failed" in states.values() or "refused" in states.values():
                sys.exit(f"a daemon run failed: {states}; see {self.log}")
            if len(states) == len(files) and set(states.values()) == {"ingested"}:
                break
            if time.monotonic() > deadline or self.process.poll() is not None:
                sys.exit(f"daemon runs not finished ({states}); see {self.log}")
            time.sleep(0.5)
        ingested = time.time()
        cpu = tree_cpu(self.process.pid) - cpu_before  # daemon, code server and the run processes it reaped
        records = [
            r
            for r in self.instance.get_run_records(
                dg.RunsFilter(tags={"dagster/sensor_name": "ingest_requests"}, created_after=_utc(dropped))
            )
        ]
        created = min(r.create_timestamp.timestamp() for r in records)
        started = [r.start_time for r in records if r.start_time]
        return {
            "seconds": max(r.end_time for r in records) - created,  # type: ignore[type-var]
            "cpu_seconds": cpu,
            "runs": len(records),
            "sensor_latency": created - dropped,
            "drop_to_ingested": ingested - dropped,
            "first_run_queued_to_started": min(started) - created if started else float("nan"),
            "median_run_start_to_end": statistics.median(r.end_time - r.start_time for r in records),  # type: ignore[operator]
        }


def _utc(timestamp: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(timestamp, dt.UTC)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, nargs="+", default=[1, 20])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--executor", choices=["default", "multiprocess", "forkserver", "in_process"], default="default"
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_daemon"))
    parser.add_argument("--seed", type=int, default=None, help="file contents (default: new each call)")
    parser.add_argument(
        "--max-runs", type=int, help="concurrency.runs.max_concurrent_runs (default: as written)"
    )
    parser.add_argument("--max-batch", type=int, help="documents per run at most (default: as the code says)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("terminated"))  # the daemon and Postgres are stopped

    from vision_rag_pipeline.core.postgres import start_embedded, stop_embedded
    from vision_rag_pipeline.defs.runner import write_local_instance_config

    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    rng = random.Random(args.seed)
    admin_url = start_embedded(args.work / "pgdata")
    suffix = uuid.uuid4().hex[:8]
    cli_env = path_env(args.work / "cli_home", create_database(admin_url, f"cli_{suffix}"))
    inbox = args.work / "inbox"
    inbox.mkdir()
    daemon_env = path_env(
        args.work / "daemon_home",
        create_database(admin_url, f"daemon_{suffix}"),
        VISION_RAG_INBOX=str(inbox),
        VISION_RAG_SENSOR_INTERVAL_SECONDS=str(SENSOR_SECONDS),
        **({"VISION_RAG_MAX_BATCH": str(args.max_batch)} if args.max_batch else {}),
    )
    instance_yaml = Path(daemon_env["DAGSTER_HOME"]) / "dagster.yaml"
    write_local_instance_config(instance_yaml.parent)  # what `vision-rag` writes
    config = yaml.safe_load(instance_yaml.read_text())
    if args.max_runs:
        config["concurrency"]["runs"]["max_concurrent_runs"] = args.max_runs
    instance_yaml.write_text(yaml.safe_dump(config))
    daemon = Daemon(args.executor, daemon_env, args.work / "daemon.log")
    results: dict[int, list[dict[str, float]]] = {}
    try:
        batch_no = 0

        def new_files(count: int) -> list[Path]:
            nonlocal batch_no
            batch_no += 1
            folder = args.work / f"batch{batch_no}"
            folder.mkdir()
            paths = [folder / f"note_{batch_no}_{i:02d}.pdf" for i in range(count)]
            for path in paths:
                write_scan(path, rng)
            return paths

        warm = new_files(1)  # schemas, the instance, the tantivy index and the OS file cache, both paths
        cli_ingest(warm, cli_env)
        daemon.ingest(warm, inbox)
        for count in args.files:
            for round_no in range(args.rounds):
                files = new_files(count)
                cli, cli_cpu = cli_ingest(files, cli_env)
                timed = daemon.ingest(files, inbox)
                row = {"cli_seconds": cli, "cli_cpu_seconds": cli_cpu, **timed}
                row = {key: round(value, 2) for key, value in row.items()}
                row["ratio"] = round(timed["seconds"] / cli, 2)
                row["cpu_ratio"] = round(timed["cpu_seconds"] / cli_cpu, 2)
                results.setdefault(count, []).append(row)
                print(json.dumps({"files": count, "round": round_no + 1, **row}), flush=True)
    finally:
        daemon.stop()
        stop_embedded(args.work / "pgdata")
    summary = {
        "executor": args.executor,
        "max_batch": args.max_batch,
        "max_runs": args.max_runs,
        **{
            f"{count}_files": {
                key: statistics.median(row[key] for row in rows)
                for key in (
                    "cli_seconds",
                    "seconds",
                    "ratio",
                    "cli_cpu_seconds",
                    "cpu_seconds",
                    "cpu_ratio",
                    "runs",
                    "sensor_latency",
                    "drop_to_ingested",
                    "first_run_queued_to_started",
                    "median_run_start_to_end",
                )
            }
            for count, rows in results.items()
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
