"""`vision-rag`: ingest, search, enrich, show the config, run the demo.

Exit codes: 0 success, 1 when any file or request failed (the rest still processed), 2 on
usage errors.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

SAMPLES = Path(__file__).resolve().parent / "samples"
DEMO_QUERIES = (  # facts that live only inside the samples' images (see samples/README.md)
    "What was revenue in Q3?",
    "What share of deliveries arrived on time?",
    "What dividend did the board approve?",
)


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
        snippet = " ".join(hit["text"].split())[:220]
        print(f"  {rank}. [{hit['kind']}] {hit['document']} ({_location(hit)})  score={hit['score']:.4f}")
        print(f"     {snippet}")


def cmd_ingest(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.ingest import ingest_paths

    report = ingest_paths(args.paths, progress=lambda line: print(line, file=sys.stderr))
    if args.json:
        _print_json(report.model_dump())
    else:
        print(
            f"{report.documents} documents, {report.images} images ({report.images_ignored} ignored, "
            f"{report.images_enriched} enriched, {report.enrichment_calls} enrichment calls, "
            f"{report.cache_hits} cache hits), {report.chunks} chunks in {report.seconds:.1f}s"
        )
        for failure in report.failed:
            print(f"FAILED {failure.path}: {failure.error}", file=sys.stderr)
    return 1 if report.failed else 0


def cmd_search(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.query import search

    if not args.text and not args.image:
        print("vision-rag search: give a TEXT or --image FILE", file=sys.stderr)
        return 2
    hits = [h.model_dump() for h in search(text=args.text, image=args.image, k=args.k, mode=args.mode)]
    if args.json:
        _print_json(hits)
    else:
        _print_hits(hits)
    return 0


def cmd_enrich(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.enrichment.service import enrich_files

    results = enrich_files([Path(p) for p in args.images])
    if args.json:
        _print_json(results)
    else:
        for item in results:
            print(f"== {item['path']}")
            if "error" in item:
                print(f"FAILED: {item['error']}")
                continue
            print(f"verdict: {item['classifier_result']['verdict']}")
            print(item["generated_response"]["content"] or "(not enriched)")
    return 1 if any("error" in item for item in results) else 0


def cmd_config_show(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.config import load_config

    config = load_config()
    if args.json:
        _print_json(config.model_dump(mode="json"))
    else:
        import yaml

        print(f"# source: {os.environ.get('VISION_RAG_CONFIG') or 'built-in defaults'}")
        print(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False, allow_unicode=True), end="")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from vision_rag_pipeline.config import home
    from vision_rag_pipeline.query import search

    samples = sorted(str(p) for p in SAMPLES.iterdir() if p.suffix.lower() in (".mhtml", ".mht", ".pdf"))
    print(f"Ingesting {len(samples)} bundled sample documents into {home()} ...")
    status = cmd_ingest(argparse.Namespace(paths=samples, json=False))
    for query in DEMO_QUERIES:
        print(f"\nsearch: {query!r}")
        _print_hits([h.model_dump() for h in search(text=query, k=3)])
    print(
        "\nNext: `vision-rag search 'your question'`, or the UI: `dagster dev -m vision_rag_pipeline.definitions`"
    )
    return status


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vision-rag", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="ingest the bundled sample documents and show example searches")
    demo.set_defaults(func=cmd_demo)

    ingest = sub.add_parser("ingest", help="ingest MHTML/PDF files through the Dagster asset graph")
    ingest.add_argument("paths", nargs="+", metavar="PATH")
    ingest.add_argument("--json", action="store_true", help="print one JSON report")
    ingest.set_defaults(func=cmd_ingest)

    search = sub.add_parser("search", help="hybrid / vector / lexical search")
    search.add_argument("text", nargs="?", metavar="TEXT")
    search.add_argument("--image", metavar="FILE", help="search by image")
    search.add_argument("-k", type=int, default=5)
    search.add_argument("--mode", choices=("hybrid", "vector", "lexical"), default="hybrid")
    search.add_argument("--json", action="store_true")
    search.set_defaults(func=cmd_search)

    enrich = sub.add_parser("enrich", help="classify and enrich image files (the media-enrichment operation)")
    enrich.add_argument("images", nargs="+", metavar="IMAGE")
    enrich.add_argument("--json", action="store_true")
    enrich.set_defaults(func=cmd_enrich)

    config = sub.add_parser("config", help="configuration")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the effective configuration")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_config_show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from vision_rag_pipeline.config import ConfigError

    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"vision-rag: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
