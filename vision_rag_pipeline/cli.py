"""`vision-rag`: ingest, search, ask, enrich, serve, status, forget, backfill, reindex, db, show the config, run the demo.

Exit codes: 0 success, 1 when any file or request failed (the rest still processed), 2 on
usage errors, 130 when interrupted (Ctrl-C, SIGTERM). Errors take one line each; `--verbose`
adds Dagster's log lines and the stack traces (which the Dagster event log keeps anyway).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TextIO

from vision_rag_pipeline.core.printable import escape_unprintable

if TYPE_CHECKING:
    from vision_rag_pipeline.documents.registry import Fate

SAMPLES = Path(__file__).resolve().parent / "samples"
DEMO_QUERIES = (  # facts that live only inside the samples' images (see samples/README.md)
    "What was revenue in Q3?",
    "What share of deliveries arrived on time?",
    "What dividend did the board approve?",
)


def _say(line: str, stream: TextIO | None = None) -> None:
    """Print a line that names files or quotes their errors: names come from whoever sent the file,
    so each unprintable character shows as its escape (core/printable.py) and the line stays one."""
    print(escape_unprintable(line), file=stream)  # None: sys.stdout as it is now


def _print_json(data: object) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False, default=str))


def _location(hit: dict) -> str:
    parts = []
    if hit.get("page"):
        parts.append(f"page {hit['page']}")
    if hit.get("bbox"):
        parts.append("bbox " + ",".join(f"{v:.0f}" for v in hit["bbox"]))
    if hit.get("char_span"):
        parts.append("chars {}-{}".format(*hit["char_span"]))
    if hit.get("image"):
        parts.append(f"image {hit['image']}")
    return "; ".join(parts) or "-"


def _print_hits(hits: list[dict]) -> None:
    if not hits:
        print("  (no hits)")
    for rank, hit in enumerate(hits, start=1):
        passages = hit.get("passages") or []
        # a page hit shows its best passage: the page's opening words say less
        snippet = " ".join((passages[0]["text"] if passages else hit["text"]).split())[:220]
        more = f", {len(passages)} passages" if passages else ""
        print(
            f"  {rank}. [{hit['kind']}] {hit['document']} ({_location(hit)}{more})  score={hit['score']:.4f}"
        )
        print(f"     {snippet}")


def cmd_ingest_submit(args: argparse.Namespace) -> int:
    """Request the files for the Dagster daemon (a cluster) and return: its `ingest_requests` sensor
    turns them into runs. Prints each requested document id."""
    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.intake import daemon_serves, request_files
    from vision_rag_pipeline.defs.runner import dagster_instance

    instance = dagster_instance()
    arrivals = request_files(instance, args.paths, "cli", defs.resolve_asset_graph(), force=args.force)
    if args.json:
        _print_json([arrival.model_dump() for arrival in arrivals])
    for arrival in arrivals:
        if arrival.outcome == "requested" and not args.json:
            _say(f"{arrival.document_id} {arrival.path}")
        elif arrival.outcome == "refused":
            _say(f"FAILED {arrival.reason}", sys.stderr)
        elif not args.json:
            _say(f"{arrival.outcome} {arrival.path}", sys.stderr)
    if not daemon_serves(instance):
        print(
            "vision-rag: no Dagster daemon serves this instance now: the documents wait, requested, until one "
            "starts (dagster dev, dagster-daemon run) or `vision-rag ingest` runs them here",
            file=sys.stderr,
        )
    return 1 if any(arrival.outcome == "refused" for arrival in arrivals) else 0


def cmd_ingest(args: argparse.Namespace) -> int:
    if args.submit:
        return cmd_ingest_submit(args)
    from vision_rag_pipeline.defs.runner import ingest_paths

    report = ingest_paths(
        args.paths,
        progress=lambda line: _say(line, sys.stderr),
        workers=args.workers,
        verbose=args.verbose,
        force=args.force,
    )
    if args.json:
        _print_json(report.model_dump())
    else:
        said = [f"{report.unchanged} unchanged, not run"] if report.unchanged else []
        said += [f"{report.duplicates} duplicates of indexed documents"] if report.duplicates else []
        print(
            f"{report.documents} documents"
            + (f" ({'; '.join(said)})" if said else "")
            + f", {report.images} images ({report.images_ignored} ignored, "
            f"{report.images_enriched} enriched, {report.enrichment_calls} enrichment calls, "
            f"{report.cache_hits} cache hits), {report.chunks} chunks in {report.seconds:.1f}s"
            + (f"; {len(report.failed)} not ingested (see above)" if report.failed else "")
        )
        if report.languages:
            seen = sorted(report.languages.items(), key=lambda item: -item[1])
            print("languages: " + ", ".join(f"{language} ({count} chunks)" for language, count in seen))
        if report.ocr_languages:
            read = sorted(report.ocr_languages.items(), key=lambda item: -item[1])
            print("OCR languages: " + ", ".join(f"{language} ({count} images)" for language, count in read))
        for warning in report.warnings:
            print(f"WARNING {warning}", file=sys.stderr)
        if report.fallbacks:
            reasons = ", ".join(f"{reason} x{count}" for reason, count in report.fallbacks.items())
            print(f"offline fallbacks: {sum(report.fallbacks.values())} ({reasons})")
    if report.interrupted:
        print(
            f"vision-rag: interrupted with {report.documents} of {len(dict.fromkeys(args.paths))} documents ingested; "
            "run the same command again to finish",
            file=sys.stderr,
        )
        return 130
    return 1 if report.failed else 0


def cmd_search(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.query import search

    if not args.text and not args.image:
        print("vision-rag search: give a TEXT or --image FILE", file=sys.stderr)
        return 2
    hits = [
        h.model_dump()
        for h in search(text=args.text, image=args.image, k=args.k, mode=args.mode, unit=args.unit)
    ]
    if args.json:
        _print_json(hits)
    else:
        _print_hits(hits)
    return 0


def cmd_enrich(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.media_enrichment import enrich_files

    results = enrich_files([Path(p) for p in args.images])
    if args.json:
        _print_json(results)
    else:
        for item in results:
            _say(f"== {item['path']}")
            if "error" in item:
                _say(f"FAILED: {item['error']}")
                continue
            print(f"verdict: {item['classifier_result']['verdict']}")
            print(item["generated_response"]["content"] or "(not enriched)")
    return 1 if any("error" in item for item in results) else 0


def cmd_ask(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.query.ask import ask

    try:
        answer = ask(args.question, image=args.image, k=args.k)
    except ValueError as exc:
        print(f"vision-rag ask: {exc}", file=sys.stderr)
        return 2
    if args.json:
        _print_json(answer.model_dump(include={"answer", "answered", "method", "citations", "hits"}))
        return 0
    print(answer.answer)
    for number, citation in enumerate(answer.citations, start=1):
        excerpt = " ".join(citation.excerpt.split())[:200]
        print(f"  [{number}] {citation.document} ({_location(citation.model_dump())}): {excerpt}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.api import UnsafeBindError, serve

    try:
        serve(args.host, args.port, ingest_on_upload=not args.no_ingest)
    except UnsafeBindError as exc:
        print(f"vision-rag serve: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """What became of every file any door was given (CLI, upload, inbox, backfill): counts by state,
    then each file that failed, was refused or is still on its way, with its one-line reason; or the
    files named (by path, file name or document id). Exit 1 when one shown failed or was refused."""
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    registry = DocumentRegistry()
    if args.files:
        fates = registry.fates(args.files)
        if args.json:
            _print_json([fate.model_dump(mode="json") for fate in fates])
        elif not fates:
            _say(f"nothing registered under {', '.join(args.files)}")
        failed = any(fate.state in ("failed", "refused") for fate in fates)
    else:
        summary = registry.summary()
        fates = summary.attention
        if args.json:
            _print_json(summary.model_dump(mode="json"))
        else:
            counts = ", ".join(f"{count} {state}" for state, count in sorted(summary.counts.items()))
            print(counts or "nothing registered yet")
        failed = bool(summary.counts.get("failed") or summary.counts.get("refused"))
    if not args.json:
        for fate in fates:
            _say(_fate_line(fate))
    return 1 if failed else 0


def _fate_line(fate: Fate) -> str:
    """One line per file: state, path, document id, door, attempts, when; then why (or what it duplicates)."""
    why = f": {fate.reason}" if fate.reason and fate.state != "ingested" else ""
    if fate.state == "duplicate":
        why = f": the same bytes as {fate.duplicate_of}, indexed once"
    return (
        f"{fate.state or 'registered':9} {fate.path} ({fate.document_id}) via {fate.door or '?'}, "
        f"{fate.attempts} attempt(s), {fate.updated_at:%Y-%m-%d %H:%M:%S}{why}"
    )


def cmd_forget(args: argparse.Namespace) -> int:
    """Drop documents: their partition, chunks, index entries, stored values and registry rows (the
    `remove_document` job, run here), or a path recorded as a duplicate or refused."""
    from vision_rag_pipeline.core.config import inbox_dir
    from vision_rag_pipeline.defs.definitions import defs
    from vision_rag_pipeline.defs.runner import console_config, dagster_instance
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    registry = DocumentRegistry()
    fates = registry.fates(args.files)
    missing = [name for name in args.files if not any(_names(fate, name) for fate in fates)]
    for name in missing:
        _say(f"FAILED {name}: nothing registered under this name", sys.stderr)
    instance = dagster_instance()
    inbox = str(inbox_dir()) + "/"
    failed = bool(missing)
    for fate in fates:
        if fate.state in ("duplicate", "refused"):
            registry.forget(fate.document_id)
            _say(f"forgot {fate.path} ({fate.state})")
            continue
        result = defs.resolve_job_def("remove_document").execute_in_process(
            instance=instance,
            run_config={
                **console_config(args.verbose),
                "ops": {"remove_document_rows": {"config": {"document_id": fate.document_id}}},
            },
            raise_on_error=False,
        )
        if not result.success:
            failed = True
            _say(f"FAILED {fate.path}: could not forget it (run {result.run_id})", sys.stderr)
            continue
        _say(
            f"forgot {fate.path} ({fate.document_id}): its partition, chunks and index entries (run {result.run_id})"
        )
        if str(Path(fate.path).expanduser().resolve()).startswith(inbox):
            _say(
                f"WARNING {fate.path} is still in the inbox: its sensor ingests it again; delete it there",
                sys.stderr,
            )
    return 1 if failed else 0


def _names(fate: Fate, name: str) -> bool:
    return name in (fate.document_id, fate.path, Path(fate.path).name) or str(
        Path(name).expanduser().resolve()
    ) == str(Path(fate.path).expanduser().resolve())


def cmd_backfill(args: argparse.Namespace) -> int:
    """Request `reenrich` runs for the partitions (default: all); run them here, or wait for the
    daemon when one serves the instance, or (--submit) leave them to it."""
    from vision_rag_pipeline.defs.backfill import UnknownPartitionError, request_backfill
    from vision_rag_pipeline.defs.intake import daemon_serves, wait_for_documents
    from vision_rag_pipeline.defs.runner import dagster_instance, document_counts, run_requested
    from vision_rag_pipeline.documents.registry import DocumentRegistry

    instance = dagster_instance()
    try:
        partitions = request_backfill(instance, args.partitions)
    except UnknownPartitionError as exc:
        print(f"vision-rag backfill: {exc}", file=sys.stderr)
        return 2
    if args.submit:
        print(
            f"requested {len(partitions)} document(s) for re-enrichment; the Dagster daemon's ingest_requests "
            "sensor runs them in batches (`vision-rag status` shows where they stand)"
        )
        return 0
    if daemon_serves(instance):
        wait_for_documents(instance, partitions)
    elif run_requested(instance, partitions, verbose=args.verbose)[0]:
        print("vision-rag: interrupted", file=sys.stderr)
        return 130
    fates = {fate.document_id: fate for fate in DocumentRegistry().fates(partitions)}
    counts = document_counts(instance, {key: fate.run_id for key, fate in fates.items() if fate.run_id})
    report = []
    for partition in partitions:
        fate = fates[partition]
        entry: dict = {"partition": partition, "success": fate.state == "ingested", "run_id": fate.run_id}
        if entry["success"]:
            got = counts.get(partition, {})
            entry |= {key: got.get(key, 0) for key in ("enrichment_calls", "cache_hits", "chunks")}
        else:
            entry["error"] = fate.reason or fate.state
        report.append(entry)
    if args.json:
        _print_json(report)
    else:
        for entry in report:
            status = "ok" if entry["success"] else "FAILED"
            detail = (
                f": {entry['error']}"
                if not entry["success"]
                else (
                    f": {entry['enrichment_calls']} enrichment calls, {entry['cache_hits']} cache hits, "
                    f"{entry['chunks']} chunks"
                )
            )
            print(f"{status} {entry['partition']}{detail} (run {entry['run_id']})")
    return 0 if all(entry["success"] for entry in report) else 1


def cmd_reindex(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.core.config import config_in_effect
    from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
    from vision_rag_pipeline.indexes.reindex import reindex

    report = reindex(open_lexical_index(), config_in_effect().config.embedding, reembed=args.reembed)
    if args.json:
        _print_json(report.model_dump())
    else:
        print(
            f"swapped in {report.vector.chunks} chunk rows and {report.vector.images} image rows "
            f"({f're-embedded: {report.reembed_reason}' if report.vector.reembedded else 'vectors copied'}, "
            f"dim {report.vector.dim}) "
            f"and {report.lexical_docs} lexical entries in {report.seconds:.1f}s"
        )
    return 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.core.config import config_in_effect

    in_effect = config_in_effect()
    if args.json:
        _print_json(in_effect.config.model_dump(mode="json"))
    else:
        import yaml

        print(f"# source: {in_effect.describe()}")
        print(
            yaml.safe_dump(in_effect.config.model_dump(mode="json"), sort_keys=False, allow_unicode=True),
            end="",
        )
    return 0


def cmd_config_path(args: argparse.Namespace) -> int:
    """The file every process of this home reads (written with the defaults on first use)."""
    from vision_rag_pipeline.core.config import config_path

    print(config_path())
    return 0


def cmd_db(args: argparse.Namespace) -> int:
    """The embedded Postgres outlives every command (runs, the UI and the CLI share it): see or stop it."""
    from vision_rag_pipeline.core.config import postgres_url
    from vision_rag_pipeline.core.postgres import embedded_data_dir, running_embedded, stop_embedded

    if postgres_url():
        print("VISION_RAG_PG_URL is set: the index is in that Postgres, which vision-rag does not manage")
        return 0
    pgdata = embedded_data_dir()
    if args.db_command == "stop":
        stopped = stop_embedded(pgdata)
        print(f"stopped embedded Postgres (pid {stopped.pid})" if stopped else f"not running ({pgdata})")
        return 0
    server = running_embedded(pgdata)
    if server is None:
        print(f"embedded Postgres not running (data in {pgdata}; the next command that needs it starts it)")
        return 3
    print(f"embedded Postgres running: pid {server.pid}, data in {pgdata}\n{server.url}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.core.config import home, inbox_dir
    from vision_rag_pipeline.query import search

    samples = sorted(str(p) for p in SAMPLES.iterdir() if p.suffix.lower() in (".mhtml", ".mht", ".pdf"))
    print(f"Ingesting {len(samples)} bundled sample documents into {home()} ...")
    status = cmd_ingest(
        argparse.Namespace(
            paths=samples, json=False, workers=None, verbose=args.verbose, force=False, submit=False
        )
    )
    for query in DEMO_QUERIES:
        print(f"\nsearch: {query!r}")
        _print_hits([h.model_dump() for h in search(text=query, k=3)])
    inbox = inbox_dir()
    inbox.mkdir(parents=True, exist_ok=True)  # the inbox sensor skips ticks while it is missing
    print(
        "\nNext: `vision-rag search 'your question'`, or the UI: `dagster dev -m vision_rag_pipeline.definitions`,"
        f"\nwhose inbox sensor ingests the MHTML and PDF files you drop into {inbox}"
    )
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vision-rag", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v", "--verbose", action="store_true", help="also print Dagster's log lines and full stack traces"
    )

    demo = sub.add_parser(
        "demo", parents=[common], help="ingest the bundled sample documents and show example searches"
    )
    demo.set_defaults(func=cmd_demo, starts_database=True, compares_config=True)

    ingest = sub.add_parser(
        "ingest", parents=[common], help="ingest MHTML/PDF files through the Dagster asset graph"
    )
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    ingest.add_argument("--json", action="store_true", help="print one JSON report")
    ingest.add_argument(
        "--workers",
        type=int,
        help="documents run at once, each in its own process (default: 2, or 1 on 1 core)",
    )
    ingest.add_argument(
        "--force",
        action="store_true",
        help="run every file, even one whose bytes and settings are those of its last complete run",
    )
    ingest.add_argument(
        "--submit",
        action="store_true",
        help="request the runs for the Dagster daemon (a cluster) and return without waiting; prints the "
        "requested document ids",
    )
    ingest.set_defaults(func=cmd_ingest, starts_database=True, compares_config=True)

    search = sub.add_parser("search", parents=[common], help="hybrid / vector / lexical search")
    search.add_argument("text", nargs="?", metavar="TEXT")
    search.add_argument("--image", metavar="FILE", help="search by image")
    search.add_argument("-k", type=int, help="hits to return (default: retrieval.k, 5)")
    search.add_argument("--mode", choices=("hybrid", "vector", "lexical"), help="default: retrieval.mode")
    search.add_argument(
        "--unit",
        choices=("chunk", "page"),
        help="a hit is a chunk or a page with its best passages (default: retrieval.unit)",
    )
    search.add_argument("--json", action="store_true")
    search.set_defaults(func=cmd_search, compares_config=True, quick_queries=True)

    enrich = sub.add_parser(
        "enrich", parents=[common], help="classify and enrich image files (the media-enrichment operation)"
    )
    enrich.add_argument("images", nargs="+", metavar="IMAGE")
    enrich.add_argument("--json", action="store_true")
    enrich.set_defaults(func=cmd_enrich, compares_config=True, quick_queries=True)

    ask = sub.add_parser("ask", parents=[common], help="answer a question with verbatim, located citations")
    ask.add_argument("question", metavar="QUESTION")
    ask.add_argument("--image", metavar="FILE", help="an image the question is about")
    ask.add_argument("-k", type=int, default=None, help="chunks retrieved for the context")
    ask.add_argument("--json", action="store_true", help="print {answer, citations, hits}")
    ask.set_defaults(func=cmd_ask, compares_config=True, quick_queries=True)

    serve = sub.add_parser(
        "serve", parents=[common], help="run the HTTP API (upload, search, chat, media enrichment)"
    )
    serve.add_argument(
        "--host", default="127.0.0.1", help="a non-loopback address needs VISION_RAG_API_TOKEN set"
    )
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--no-ingest",
        action="store_true",
        help="never run requested documents here: leave them to a Dagster daemon",
    )
    serve.set_defaults(func=cmd_serve, compares_config=True)

    status = sub.add_parser(
        "status",
        parents=[common],
        help="what became of the files every door was given (CLI, upload, inbox, backfill): requested, "
        "queued, running, ingested, duplicate, or failed/refused with the reason (exit 1 when one failed)",
    )
    status.add_argument("files", nargs="*", metavar="FILE", help="paths, file names or document ids")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=cmd_status, quick_queries=True)

    forget = sub.add_parser(
        "forget",
        parents=[common],
        help="drop documents: their partition, chunks, index entries and registry rows",
    )
    forget.add_argument("files", nargs="+", metavar="FILE", help="paths, file names or document ids")
    forget.set_defaults(func=cmd_forget, starts_database=True)

    backfill = sub.add_parser(
        "backfill",
        parents=[common],
        help="re-enrich, re-chunk, re-embed and re-index partitions (after a prompt/model change)",
    )
    backfill.add_argument("--partitions", nargs="+", metavar="KEY", help="document partitions (default: all)")
    backfill.add_argument(
        "--submit",
        action="store_true",
        help="request the runs for the Dagster daemon and return without waiting",
    )
    backfill.add_argument("--json", action="store_true")
    backfill.set_defaults(func=cmd_backfill, compares_config=True)

    reindex = sub.add_parser(
        "reindex", parents=[common], help="rebuild the vector and lexical indexes aside and swap them in"
    )
    reindex.add_argument("--reembed", action="store_true", help="embed every chunk again")
    reindex.add_argument("--json", action="store_true")
    reindex.set_defaults(func=cmd_reindex, compares_config=True)

    db = sub.add_parser(
        "db", parents=[common], help="the embedded Postgres: status (exit 3 when stopped) or stop"
    )
    db.add_argument("db_command", choices=("status", "stop"))
    db.set_defaults(func=cmd_db)

    config = sub.add_parser("config", parents=[common], help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", parents=[common], help="print the effective configuration")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_config_show)
    path = config_sub.add_parser(
        "path",
        parents=[common],
        help="print the config file in effect (VISION_RAG_CONFIG, else $VISION_RAG_HOME/config.yaml)",
    )
    path.set_defaults(func=cmd_config_path)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from vision_rag_pipeline.core.config import SplitBrainError, require_shared_stores

    try:  # before anything starts a database or opens an index on this host
        require_shared_stores()
    except SplitBrainError as exc:
        print(f"vision-rag: {exc}", file=sys.stderr)
        return 2
    with _index_database_starting(
        getattr(args, "starts_database", False), compare_config=getattr(args, "compares_config", False)
    ):
        return _run_command(args)


@contextmanager
def _index_database_starting(start: bool, compare_config: bool = False) -> Iterator[None]:
    """Start the index database (on a new home: initdb, ~0.8 s) on a thread while Dagster imports
    (~2 s); joined on the way out, so an early exit never leaves a half-made cluster behind.

    With `compare_config` the thread then says, once, when this process' config differs from the one
    the deployment's runs last used (`core/config_in_use.py`): before this command's own runs record theirs.
    """
    if not start and not compare_config:
        yield
        return

    from vision_rag_pipeline.core.postgres import database_url, quiet_embedded_server_notice

    quiet_embedded_server_notice()  # the thread would print it before the command's filters exist

    def start_database() -> None:
        with suppress(Exception):  # best effort: the command's own first use reports the reason
            database_url()
            if compare_config:
                from vision_rag_pipeline.core.config import config_in_effect
                from vision_rag_pipeline.core.config_in_use import last_config_used, say_once_if_different

                say_once_if_different(
                    config_in_effect(),
                    last_config_used(),
                    lambda line: print(f"vision-rag: {line}", file=sys.stderr),
                )

    thread = threading.Thread(target=start_database, name="start-index-database")
    thread.start()
    try:
        yield
    finally:
        thread.join()


def _run_command(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.core.terminal import exception_line, quiet_library_noise

    quiet_library_noise()
    from vision_rag_pipeline.core.config import ConfigError

    try:
        if not getattr(args, "quick_queries", False):
            return args.func(args)
        from vision_rag_pipeline.core.postgres import database_limits, statement_timeout

        with statement_timeout(database_limits().request_timeout_s):  # a hung database fails it in seconds
            return args.func(args)
    except (ConfigError, ValueError) as exc:  # a bad config file, query or image: one line, no traceback
        print(f"vision-rag: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("vision-rag: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a broken database, a full disk...: one line unless asked for the trace
        if args.verbose:
            traceback.print_exc()
        print(f"vision-rag: {exception_line(exc)} (--verbose shows where)", file=sys.stderr)
        return 1


def run() -> NoReturn:
    """The `vision-rag` command: `main`, then exit without tearing the interpreter down.

    Freeing torch's and Dagster's modules at exit took 1-3 s after the work was done (a one-file
    ingest spent a fifth of its wall time there). Exit handlers still run and the output is flushed.
    """
    code = main()
    atexit._run_exitfuncs()  # no public name: the handlers interpreter shutdown would have run
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
