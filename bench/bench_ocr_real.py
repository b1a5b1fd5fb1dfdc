"""OCR alone on the real images ingest reads: CPU seconds, Tesseract reads by kind, words kept.

    .venv/bin/python bench/bench_ocr_real.py [--set corpus|mmlongbench|DIR] [--languages auto|eng,...]
                                             [--out readings.json] [--against other_readings.json]

Takes every image of the set the classifier sends to enrichment (each distinct picture once; a DIR
of documents, such as bench/evalset_languages.py's, is taken whole) and reads it in one thread as an
ingest worker does: in the configured OCR languages (default: the config's default, `auto`), each
image with what its page says around it. Prints the CPU time, Tesseract's share of it by kind of
read (first, orientation, language check, sparse, other layout, rotated, re-read sheets), the images
per set of languages they were read with, and the words the readings hold: whole words of the
embedding model's vocabulary (three letters or more) and numbers of two digits or more, a proxy for
real text that noise from photos rarely hits; "indexed words" counts those of the readings that
reach the index (a Low reading of a picture does not). With `--against`, the words one set of
readings has and the other lacks, per image, and number by number (two digits or more, as printed:
"20,843", "74.6%") the numbers of the indexed readings one has and the other lacks: run the script
with two checkouts (`PYTHONPATH=<checkout>`) to compare OCR versions on real documents.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_real_ingest import document_sets  # noqa: E402
from eval_real import DEFAULT_CORPUS  # noqa: E402

from vision_rag_pipeline.core.config import RagConfig  # noqa: E402
from vision_rag_pipeline.documents.loader import load_document  # noqa: E402
from vision_rag_pipeline.embeddings.encoder import model_directory  # noqa: E402
from vision_rag_pipeline.enrichment import languages as ocr_languages  # noqa: E402
from vision_rag_pipeline.enrichment import ocr  # noqa: E402
from vision_rag_pipeline.enrichment.classifier import classify_images  # noqa: E402
from vision_rag_pipeline.enrichment.preprocess import load_image  # noqa: E402

_TOKEN = re.compile(r"\w+")
_NUMBER = re.compile(r"\d[\d.,:/%]*\d%?")


def numbers(text: str) -> set[str]:
    """The numbers of a reading as printed, each once: two digits or more."""
    return {n for n in _NUMBER.findall(text) if sum(c.isdigit() for c in n) >= 2}


def enriched_images(documents: list[Path], classify: bool = True) -> dict[str, tuple[object, str, bool]]:
    """Name -> (picture, what its page says around it, whether it is a page image) of every distinct
    image the classifier sends to enrichment and OCR reads (not the scans whose PDF text layer stands
    in for OCR)."""
    classifier = RagConfig().media_enrichment.features.classifier
    pictures, seen = {}, set()
    for doc in documents:
        loaded = load_document(doc, source_path=str(doc))
        verdicts = classify_images(loaded.images, classifier) if classify else [None] * len(loaded.images)
        for image, verdict in zip(loaded.images, verdicts, strict=True):
            wanted = verdict is None or verdict.verdict == "VISION"
            if wanted and not image.text_layer and image.sha256 not in seen:
                seen.add(image.sha256)
                hint = " ".join((image.alt, image.title, image.caption, image.context))
                pictures[f"{doc.name}/{image.name}"] = (
                    load_image(image.data, image.mime),
                    hint,
                    image.is_page_image,
                )
    return pictures


def read_kind(image: object, psm: int, page: object) -> str:
    """Which of `ocr_image`'s reads a Tesseract call on `image` is. The first read's image is the
    page: later reads of that very image are the sparse or the other layout one, a new image of the
    page's size (either way round) is the page turned, any other size a sheet of re-read crops."""
    if image is page:
        return "sparse" if psm == 11 else "other layout"
    return "rotated" if image.size in (page.size, page.size[::-1]) else "sheets"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="corpus", help="corpus, mmlongbench or a folder of documents")
    parser.add_argument(
        "--languages", default=None, help="auto or a comma-separated list (default: the config's default)"
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--out", type=Path, help="write each image's reading here (JSON)")
    parser.add_argument("--against", type=Path, help="readings written by another run, to compare words")
    args = parser.parse_args()
    vocabulary = {
        word
        for word in (model_directory(RagConfig().embedding.model) / "vocab.txt").read_text().split()
        if word.isalpha() and len(word) >= 3
    }

    def words(text: str) -> set[str]:
        tokens = _TOKEN.findall(text.lower())
        return {t for t in tokens if t in vocabulary or (t.isdigit() and len(t) >= 2)}

    sets = document_sets(args.corpus)
    if args.set in sets:
        pictures = enriched_images(sets[args.set])
    else:  # a generated set: every image is content
        pictures = enriched_images(sorted(p for p in Path(args.set, "docs").iterdir()), classify=False)
    configured = RagConfig().media_enrichment.ocr.languages if args.languages is None else args.languages
    allowed = ocr_languages.resolve_languages(
        configured if configured == ocr_languages.AUTO else configured.split(",")
    )
    read_tsv, read_lines, by_kind = ocr.read_tsv, ocr_languages._read_lines, Counter()
    # (a checkout older than the orientation step has neither: its reads are then never "orientation")
    read_upright, text_turn = getattr(ocr_languages, "read_upright", None), getattr(ocr, "text_turn", None)
    page: list[object] = []  # the current picture's page image and its first read's psm
    orienting: list[bool] = []  # set while the image may be turned upright (after its first read)
    first_reads: list[str] = []  # the current picture's first read, to tell whether it was replaced
    oriented = Counter()  # images asked which way up they are, and turned
    checking: list[bool] = []  # set while the language check reads its sheet
    checked_languages: list[bool] = []  # set after it, until the page is read again

    def timed(gray, psm, languages, **options):  # noqa: ANN001, ANN202 - same signature as the original
        started = time.process_time()
        tsv = read_tsv(gray, psm, languages, **options)
        if checking:
            kind = "language check"
        elif orienting and page:
            kind = "orientation"  # the page turned upright, read before it replaces the first
        elif checked_languages and page and gray is page[0] and psm == page[1]:
            kind = "first, in the languages found"  # the first read again, after the check changed them
        else:
            kind = read_kind(gray, psm, page[0]) if page else "first"
            if not page:
                first_reads[:] = [tsv]
            page[:] = page or [gray, psm]
        by_kind[kind] += time.process_time() - started
        return tsv

    def checked(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        checking.append(True)
        try:
            return read_lines(*args, **kwargs)
        finally:
            checking.clear()
            checked_languages[:] = [True]

    def upright(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        orienting.append(True)
        try:
            prepared, tsv = read_upright(*args, **kwargs)
        finally:
            orienting.clear()
        oriented["turned"] += bool(first_reads) and tsv is not first_reads[0]
        page[:] = [prepared.page, prepared.first_psm]  # later reads are of the page it chose
        return prepared, tsv

    def turn(gray):  # noqa: ANN001, ANN202
        started = time.process_time()
        found = text_turn(gray)
        by_kind["orientation"] += time.process_time() - started
        oriented["asked"] += 1
        return found

    ocr.read_tsv, ocr_languages.read_tsv, ocr_languages._read_lines = timed, timed, checked
    if read_upright and text_turn:
        ocr_languages.read_upright, ocr.text_turn = upright, turn
    readings, read_with, checked, started = {}, Counter(), 0, time.process_time()
    indexed = {}
    for name, (picture, hint, page_image) in pictures.items():
        page.clear()
        first_reads.clear()
        checked_languages.clear()
        result = ocr_languages.read_image(picture, allowed, hint, picture=not page_image)
        readings[name] = result.text
        indexed[name] = result.text if result.level != "Low" or page_image else ""
        read_with["+".join(result.languages)] += 1
        checked += bool(checked_languages)
    cpu = time.process_time() - started
    report = {
        "set": args.set,
        "images": len(pictures),
        "ocr_cpu_s": round(cpu, 1),
        "languages": allowed,
        "images_checked_for_other_scripts": checked,
        "images_read_with": dict(read_with.most_common()),
        "tesseract_s_by_read": {kind: round(seconds, 1) for kind, seconds in by_kind.most_common()},
        "images_asked_which_way_up": oriented["asked"],
        "images_turned_upright": oriented["turned"],
        "words": sum(len(words(text)) for text in readings.values()),
        "indexed_words": sum(len(words(text)) for text in indexed.values()),
    }
    if args.against:
        there = json.loads(args.against.read_text())
        other = {name: words(reading["text"]) for name, reading in there.items()}
        here = {name: words(text) for name, text in readings.items()}
        report["words_only_here"] = {
            n: sorted(w - other.get(n, set())) for n, w in here.items() if w - other.get(n, set())
        }
        report["words_only_there"] = {
            n: sorted(other.get(n, set()) - w) for n, w in here.items() if other.get(n, set()) - w
        }
        numbers_here = {n: numbers(text) for n, text in indexed.items()}
        numbers_there = {n: numbers(r["text"]) if r["indexed"] else set() for n, r in there.items()}
        report["indexed_numbers"] = sum(map(len, numbers_here.values()))
        report["indexed_numbers_there"] = sum(map(len, numbers_there.values()))
        report["numbers_only_here"] = {
            n: sorted(found - numbers_there.get(n, set()))
            for n, found in numbers_here.items()
            if found - numbers_there.get(n, set())
        }
        report["numbers_only_there"] = {
            n: sorted(numbers_there.get(n, set()) - found)
            for n, found in numbers_here.items()
            if numbers_there.get(n, set()) - found
        }
    if args.out:
        written = {name: {"text": text, "indexed": bool(indexed[name])} for name, text in readings.items()}
        args.out.write_text(json.dumps(written, ensure_ascii=False, indent=1))
    print(json.dumps(report, ensure_ascii=False, indent=1))


if __name__ == "__main__":
    main()
