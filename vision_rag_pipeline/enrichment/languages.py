"""Which Tesseract languages read an image: every script it holds, with the languages installed.

`media_enrichment.ocr.languages` is `auto` by default: OCR may read with English for Latin script
and with the most used installed language of every other script (`auto_languages`); a list names
the languages instead (each must be installed: `resolve_languages`). Reading with all of them at once
would be slow and wrong (Russian in the mix turns "Q3" into "ОЗ"), so each image is read in the
languages of the scripts it holds, found as follows (`read_image`):

1. The first read is made in the base languages (English, or the first listed language's script),
   as it is made anyway (of the image turned upright when its text is not: `read_upright`). Words it
   is sure of are that script.
2. The image is checked for other scripts only when that reading leaves letters in doubt: when
   the image's own surroundings (alt text, caption, the text around it) are written in another
   allowed script, any doubted line will do; otherwise (no surroundings, or Latin ones) at least
   `DOUBTED_MIN_LETTERS` letters and `DOUBTED_MIN_SHARE` of all it read. English pages, charts and
   photos in English documents are not checked at all.
3. The check: the two most doubted lines, cut out and set on one small sheet, are read once in the
   base language and once in one language of each other candidate script. A line is in the script
   whose language reads it most surely, if that is sure (`CONTEST_MIN_CONFIDENCE`) and much surer
   than the base language (`CONTEST_MIN_MARGIN`); else it says nothing.
4. The image is read in the allowed languages of the scripts present; a CJK script brings English
   along for numbers and Latin words. When the base script is all there is, the first read is kept.

What it costs and how often it is right: BENCHMARKS.md, "Retrieval on the Chinese and Russian set".
"""

from __future__ import annotations

import unicodedata
from collections import Counter

from PIL import Image

from vision_rag_pipeline.enrichment.model import OcrResult
from vision_rag_pipeline.enrichment.ocr import (
    HIGH_CONFIDENCE,
    OcrError,
    PreparedPage,
    TsvWord,
    available_languages,
    letter_count,
    missing_language_error,
    missing_languages,
    read_page,
    read_tsv,
    read_upright,
    traineddata_sha256,
    tsv_words,
)

AUTO = "auto"
# Bump when the choice of languages per image changes (cache key and enrichment code version include it).
LANGUAGE_REVISION = 3
DOUBTED_MIN_LETTERS = 20
DOUBTED_MIN_SHARE = 0.8
DOUBTED_LINE_MIN_LETTERS = 3
CONTEST_LINES = 2
CONTEST_LINE_HEIGHT = 32  # px: each contested line is scaled to this height ...
CONTEST_LINE_WIDTH = 480  # ... and cut to this width: the sheet costs a few ms per language
CONTEST_MIN_CONFIDENCE = 75.0
CONTEST_MIN_MARGIN = 10.0
CONTEST_MIN_CHARACTERS = 4  # a line read as two characters says nothing about its script
BASE_PRESENT_SHARE = (
    0.3  # of the letters the first read found, surely read ones: the base script is there too
)
HINT_MIN_SHARE = 0.15  # a script with less of the surroundings' letters than this is a stray name
_WIDE_SCRIPTS = frozenset({"Han", "Kana", "Hangul"})  # one character of these is about a short word

# The script(s) each Tesseract language reads, most used language of a script first (it is the one
# tried first); a language not named here is written in Latin. Vertical-text models are left to
# explicit lists: the lines compared are horizontal.
_LANGUAGE_SCRIPTS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(
        ["rus", "ukr", "bel", "bul", "mkd", "srp", "kaz", "kir", "mon", "tgk", "tat", "uzb_cyrl"],
        ("Cyrillic",),
    ),
    "chi_sim": ("Han",),
    "chi_tra": ("Han",),
    "jpn": ("Kana", "Han"),
    "kor": ("Hangul", "Han"),
    **dict.fromkeys(["ell", "grc"], ("Greek",)),
    **dict.fromkeys(["ara", "fas", "urd", "pus", "uig", "snd"], ("Arabic",)),
    **dict.fromkeys(["heb", "yid"], ("Hebrew",)),
    **dict.fromkeys(["hin", "mar", "nep", "san"], ("Devanagari",)),
    **dict.fromkeys(["ben", "asm"], ("Bengali",)),
    "tha": ("Thai",),
    "hye": ("Armenian",),
    "kat": ("Georgian",),
    "amh": ("Ethiopic",),
    "tam": ("Tamil",),
    "tel": ("Telugu",),
    "kan": ("Kannada",),
    "mal": ("Malayalam",),
    "guj": ("Gujarati",),
    "pan": ("Gurmukhi",),
    "sin": ("Sinhala",),
    "khm": ("Khmer",),
    "lao": ("Lao",),
    "mya": ("Myanmar",),
    "bod": ("Tibetan",),
    **dict.fromkeys(["chi_sim_vert", "chi_tra_vert", "jpn_vert", "kor_vert"], ("Vertical",)),
    "equ": ("Math",),
}
# Unicode names whose first word is not the script's name
_UNICODE_SCRIPT = {"CJK": "Han", "HIRAGANA": "Kana", "KATAKANA": "Kana", "HANGUL": "Hangul"}


def language_scripts(language: str) -> tuple[str, ...]:
    return _LANGUAGE_SCRIPTS.get(language, ("Latin",))


def _script(language: str) -> str:
    return language_scripts(language)[0]


def auto_languages() -> list[str]:
    """What `auto` may read with on this host: English for Latin script and, for every other script
    with an installed language, its most used one (rus, chi_sim, jpn, kor ...).

    Further languages of a script are for explicit lists: read beside English, the other Latin-script
    languages make every English image several times slower; chi_tra beside chi_sim slows Chinese
    images and may write simplified text in traditional characters, which simplified questions miss;
    and two lines are too little to tell such siblings apart (they took chi_tra for simplified slides).
    """
    installed = available_languages()
    first_of_script: dict[str, str] = {}
    for language in _LANGUAGE_SCRIPTS:
        if language in installed:
            first_of_script.setdefault(_script(language), language)
    for script in ("Vertical", "Math"):
        first_of_script.pop(script, None)
    return (["eng"] if "eng" in installed else []) + list(first_of_script.values())


def language_set(configured: list[str] | str) -> list[str]:
    """The languages OCR may read with on this host as configured: the list (a host without one of
    them fails instead), or `auto` and the languages it reads with here."""
    return ["auto", *auto_languages()] if configured == AUTO else list(configured)


def language_fingerprint(configured: list[str] | str) -> str:
    """What the enrichment code version, the cache key and a run's host inputs record of the OCR
    languages: `language_set` and the sha256 of those languages' traineddata on this host. Hosts with
    other languages installed under `auto`, or other models under the same names, neither share
    readings nor pass for up to date."""
    names = language_set(configured)
    return "+".join(names) + ":" + traineddata_sha256(tuple(n for n in names if n != AUTO))[:16]


def resolve_languages(configured: list[str] | str) -> list[str]:
    """The languages OCR may read with on this host, in order: `auto_languages()`, or the list as
    configured. A listed language this host lacks is an OcrError naming it and its package: reading
    without it would index other words than a host that has it, under the same code version."""
    if configured == AUTO:
        languages = auto_languages()
        if not languages:
            raise OcrError("tesseract is not installed or not on PATH (apt-get install tesseract-ocr)")
        return languages
    if missing := missing_languages(list(configured)):
        raise OcrError(missing_language_error(missing[0]))
    return list(dict.fromkeys(configured))


def read_image(img: Image.Image, languages: list[str], hint: str = "", *, picture: bool = False) -> OcrResult:
    """Read the image in the languages (of `languages`, resolved) of the scripts it holds.

    `hint` is what the document says around the image (alt text, caption, surrounding text): the
    scripts it is written in are the likely ones. `picture`: a picture on a page, not a page image
    (`read_page`).
    """
    base = [lang for lang in languages if _script(lang) == _script(languages[0])]
    prepared, tsv = read_upright(img, base, picture=picture)
    chosen = choose_languages(prepared, tsv, base, languages, hint)
    return read_page(prepared, chosen, tsv if chosen == base else None, picture=picture)


def _representatives(languages: list[str], base_script: str) -> dict[str, str]:
    """{script: its first language} for every script of `languages` but the base one."""
    found: dict[str, str] = {}
    for language in languages:
        found.setdefault(_script(language), language)
    found.pop(base_script, None)
    return found


def hint_scripts(text: str) -> set[str]:
    """The scripts a text is written in (Unicode's names), each with a fair share of its letters."""
    weights: Counter[str] = Counter()
    for char in text:
        if char.isalpha():
            name = unicodedata.name(char, "").removeprefix("FULLWIDTH ").removeprefix("HALFWIDTH ").split(" ")
            script = _UNICODE_SCRIPT.get(name[0], name[0].title())
            weights[script] += 3 if script in _WIDE_SCRIPTS else 1
    total = sum(weights.values())
    return {script for script, weight in weights.items() if weight >= HINT_MIN_SHARE * total}


def choose_languages(
    prepared: PreparedPage, tsv: str, base: list[str], languages: list[str], hint: str = ""
) -> list[str]:
    """The languages to read the page with, given its first read (`tsv`, in `base`); see the module
    docstring for the steps."""
    base_script = _script(base[0])
    candidates = _representatives(languages, base_script)
    if not candidates:
        return base
    words = tsv_words(tsv)
    sure = sum(letter_count(w.text) for w in words if w.conf >= HIGH_CONFIDENCE)
    doubted = sum(letter_count(w.text) for w in words if w.conf < HIGH_CONFIDENCE)
    hinted = {script: lang for script, lang in candidates.items() if script in hint_scripts(hint)}
    if hinted:
        candidates = hinted
    elif doubted < DOUBTED_MIN_LETTERS or doubted < DOUBTED_MIN_SHARE * (sure + doubted):
        return base
    lines = _most_doubted_lines(words)
    if not lines:
        return base
    sheet, spans = _line_sheet(prepared.page, lines)
    reads = {lang: _read_lines(sheet, spans, lang) for lang in [base[0], *candidates.values()]}
    won: Counter[str] = Counter()
    for line, (base_conf, _) in enumerate(reads[base[0]]):
        script = max(candidates, key=lambda s: reads[candidates[s]][line][0])  # each line has one script
        conf, chars = reads[candidates[script]][line]
        if (
            conf >= CONTEST_MIN_CONFIDENCE
            and conf >= base_conf + CONTEST_MIN_MARGIN
            and chars >= CONTEST_MIN_CHARACTERS
        ):
            won[script] += chars
    if not won and hinted and doubted >= 0.5 * (sure + doubted):
        won = Counter(
            dict.fromkeys(hinted, 1)
        )  # small labels no read is sure of, in a document in that script
    if not won:
        return base
    chosen = [lang for script, _ in won.most_common() for lang in languages if _script(lang) == script]
    if sure >= BASE_PRESENT_SHARE * (sure + doubted):
        chosen = [*base, *chosen] if sure >= doubted else [*chosen, *base]
    if "eng" in languages and any(_script(lang) in _WIDE_SCRIPTS for lang in chosen):
        chosen.append("eng")  # numbers and Latin words on CJK pages read better with it
    return list(dict.fromkeys(chosen))


def _most_doubted_lines(words: list[TsvWord]) -> list[list[TsvWord]]:
    """The `CONTEST_LINES` lines of the first read with the most letters it doubted."""
    lines: dict[tuple[str, str, str], list[TsvWord]] = {}
    for word in words:
        lines.setdefault(word.line, []).append(word)
    doubted = {
        key: sum(letter_count(w.text) for w in line if w.conf < HIGH_CONFIDENCE)
        for key, line in lines.items()
    }
    ranked = sorted(
        (key for key in lines if doubted[key] >= DOUBTED_LINE_MIN_LETTERS), key=lambda k: -doubted[k]
    )
    return [lines[key] for key in ranked[:CONTEST_LINES]]


def _line_sheet(page: Image.Image, lines: list[list[TsvWord]]) -> tuple[Image.Image, list[tuple[int, int]]]:
    """The lines cut out of the page, scaled to one height and stacked on a white sheet, with the
    vertical span of each on it."""
    gap = CONTEST_LINE_HEIGHT // 2
    crops = []
    for line in lines:
        left, top = min(w.left for w in line), min(w.top for w in line)
        right, bottom = max(w.left + w.width for w in line), max(w.top + w.height for w in line)
        pad = max(2, (bottom - top) // 4)
        crop = page.crop((left - pad, top - pad, right + pad, bottom + pad))
        width = max(1, round(crop.width * CONTEST_LINE_HEIGHT / max(crop.height, 1)))
        crop = crop.resize((width, CONTEST_LINE_HEIGHT), Image.Resampling.LANCZOS)
        crops.append(crop.crop((0, 0, min(width, CONTEST_LINE_WIDTH), CONTEST_LINE_HEIGHT)))
    sheet = Image.new(
        "L", (max(c.width for c in crops) + 2 * gap, len(crops) * (CONTEST_LINE_HEIGHT + gap) + gap), 255
    )
    spans = []
    for slot, crop in enumerate(crops):
        top = gap + slot * (CONTEST_LINE_HEIGHT + gap)
        sheet.paste(crop, (gap, top))
        spans.append((top, top + CONTEST_LINE_HEIGHT))
    return sheet, spans


def _read_lines(sheet: Image.Image, spans: list[tuple[int, int]], language: str) -> list[tuple[float, int]]:
    """(mean word confidence, characters) of each line of the sheet, read in one language."""
    words = tsv_words(read_tsv(sheet, 6, [language]))
    margin = CONTEST_LINE_HEIGHT // 4
    out = []
    for top, bottom in spans:
        on_line = [w for w in words if top - margin <= w.top + w.height / 2 < bottom + margin]
        conf = sum(w.conf for w in on_line) / len(on_line) if on_line else 0.0
        out.append((conf, sum(len(w.text) for w in on_line)))
    return out
