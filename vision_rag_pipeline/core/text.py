"""Word lists and script detection shared by indexing, enrichment and querying: one home, so they cannot drift apart."""

import re

# Lucene's English stop set, which is also tantivy's `stopword("english")` list: what the lexical
# analyzers drop, so a query of only these words must match nothing.
_ENGLISH_STOP_LIST = (
    "a an and are as at be but by for if in into is it no not of on or such that the their then there "
    "these they this to was will with"
)
ENGLISH_STOP_WORDS = frozenset(_ENGLISH_STOP_LIST.split())

# Interrogatives and auxiliaries: they shape a question but never name what it asks about.
QUESTION_WORDS = frozenset(
    [
        "what",
        "which",
        "who",
        "whom",
        "whose",
        "when",
        "where",
        "why",
        "how",
        "according",
        "did",
        "does",
        "do",
        "was",
        "were",
        "is",
        "are",
        "has",
        "have",
        "had",
        "much",
        "many",
        "can",
        "could",
        "would",
        "should",
        "will",
        "shall",
    ]
)

# Every English function word (pronouns, prepositions, auxiliaries, quantifiers): not a keyword.
FUNCTION_WORDS = (
    ENGLISH_STOP_WORDS
    | QUESTION_WORDS
    | frozenset(
        [
            "about",
            "above",
            "after",
            "again",
            "against",
            "all",
            "also",
            "am",
            "any",
            "because",
            "been",
            "before",
            "being",
            "below",
            "between",
            "both",
            "doing",
            "down",
            "during",
            "each",
            "few",
            "from",
            "further",
            "having",
            "he",
            "her",
            "here",
            "hers",
            "herself",
            "him",
            "himself",
            "his",
            "i",
            "its",
            "itself",
            "just",
            "me",
            "more",
            "most",
            "my",
            "myself",
            "nor",
            "now",
            "off",
            "once",
            "only",
            "other",
            "our",
            "ours",
            "ourselves",
            "out",
            "over",
            "own",
            "per",
            "same",
            "she",
            "so",
            "some",
            "than",
            "theirs",
            "them",
            "themselves",
            "those",
            "through",
            "too",
            "under",
            "until",
            "up",
            "very",
            "via",
            "we",
            "while",
            "within",
            "without",
            "you",
            "your",
            "yours",
            "yourself",
        ]
    )
)

# Snowball's Russian stop list (what the Russian analyzers drop); `ё` folded to `е` is not assumed.
_RUSSIAN_STOP_LIST = (
    "и в во не что он на я с со как а то все она так его но да ты к у же вы за бы по только ее мне "
    "было вот от меня еще нет о из ему теперь когда даже ну вдруг ли если уже или ни быть был него "
    "до вас нибудь опять уж вам ведь там потом себя ничего ей может они тут где есть надо ней для мы "
    "тебя их чем была сам чтоб без будто чего раз тоже себе под будет ж тогда кто этот того потому "
    "этого какой совсем ним здесь этом один почти мой тем чтобы нее сейчас были куда зачем всех "
    "никогда можно при наконец два об другой хоть после над больше тот через эти нас про всего них "
    "какая много разве три эту моя впрочем хорошо свою этой перед иногда лучше чуть том нельзя такой "
    "им более всегда конечно всю между"
)
RUSSIAN_STOP_WORDS = frozenset(_RUSSIAN_STOP_LIST.split())
# Russian interrogatives: like QUESTION_WORDS, they shape a question, never name its subject.
RUSSIAN_QUESTION_WORDS = frozenset(
    [
        "какова",
        "каков",
        "каковы",
        "какое",
        "какие",
        "какой",
        "какая",
        "каким",
        "сколько",
        "что",
        "кто",
        "где",
        "когда",
        "почему",
        "зачем",
        "как",
        "чему",
        "чем",
        "чего",
        "составила",
        "составил",
        "составило",
        "составили",
        "был",
        "была",
        "было",
        "были",
    ]
)
# Words a query never asks about, in every language the analyzers know: not matched as terms.
NOT_QUERY_TERMS = ENGLISH_STOP_WORDS | QUESTION_WORDS | RUSSIAN_STOP_WORDS | RUSSIAN_QUESTION_WORDS
# Chinese particles and question words; Chinese is matched as character bigrams, so these are cut
# out of a question before it is cut into bigrams. Only characters that rarely start or end a
# content word: "中" or "有" would split 中国 and 有限公司.
CHINESE_STOP_WORDS = frozenset(
    [
        "的",
        "了",
        "是",
        "吗",
        "呢",
        "么",
        "多少",
        "什么",
        "哪个",
        "哪些",
        "是否",
        "如何",
        "怎么",
        "为什么",
        "请问",
    ]
)

# Scripts by Unicode block. Han, kana and Hangul are written without spaces between words.
_SCRIPT_RANGES = {
    "Han": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff",
    "Kana": "\u3040-\u30ff",
    "Hangul": "\uac00-\ud7af",
    "Cyrillic": "\u0400-\u04ff",
    "Latin": "A-Za-z\u00c0-\u024f",
}
_SCRIPT_CHAR = {script: re.compile(f"[{chars}]") for script, chars in _SCRIPT_RANGES.items()}
CJK_CHAR = re.compile(f"[{_SCRIPT_RANGES['Kana']}{_SCRIPT_RANGES['Han']}{_SCRIPT_RANGES['Hangul']}]")
CJK_RUN = re.compile(CJK_CHAR.pattern + "+")
# The language a script stands for when only the script is known (Latin counts as English).
SCRIPT_LANGUAGE = {"Han": "zh", "Kana": "ja", "Hangul": "ko", "Cyrillic": "ru", "Latin": "en"}


# A month named in full or abbreviated is one word: chart axes write "Apr", questions "April".
_MONTHS = "january february march april june july august september october november december"
ENGLISH_MONTH_ABBREVIATIONS = {month: month[:3] for month in _MONTHS.split()} | {"sept": "sep"}


def script_counts(text: str) -> dict[str, int]:
    """Letters per script, most frequent first (scripts without letters left out)."""
    counts = {script: len(pattern.findall(text)) for script, pattern in _SCRIPT_CHAR.items()}
    return dict(sorted(((s, n) for s, n in counts.items() if n), key=lambda item: -item[1]))


def text_language(text: str) -> str | None:
    """The language of a text as its main script tells it (zh, ja, ko, ru, en); None without letters.

    A guess by script alone: Latin text counts as English, Cyrillic as Russian; kana anywhere
    makes Han text Japanese. A Han character weighs as much as a short word, so it counts three times.
    """
    counts = script_counts(text)
    if not counts:
        return None
    if counts.get("Kana"):
        counts["Han"] = 0
    weighted = {s: n * (3 if s in ("Han", "Kana", "Hangul") else 1) for s, n in counts.items()}
    return SCRIPT_LANGUAGE[max(weighted, key=lambda s: weighted[s])]


def cjk_bigrams(text: str, *, with_unigrams: bool = False) -> list[str]:
    """Overlapping character bigrams of each CJK run (like Lucene's `cjk` analyzer); a lone
    character stays a unigram. `with_unigrams` adds every character too (index side)."""
    tokens: list[str] = []
    for run in CJK_RUN.findall(text):
        if len(run) == 1:
            tokens.append(run)
            continue
        tokens.extend(run[i : i + 2] for i in range(len(run) - 1))
        if with_unigrams:
            tokens.extend(run)
    return tokens


def without_chinese_stop_words(text: str) -> str:
    """The text with Chinese function and question words cut out (each cut splits a CJK run)."""
    return _CHINESE_STOP.sub(" ", text)


_CHINESE_STOP = re.compile("|".join(sorted(CHINESE_STOP_WORDS, key=len, reverse=True)))


# --- homoglyphs in codes ---------------------------------------------------------------------------

# Cyrillic and Greek letters drawn like a Latin letter, in both cases, each with that Latin letter in
# the same case: folding then commutes with lower-casing, which every analyzer applies after it.
_LOOKALIKES = "АВЕКМНОРСТУХЅІЈԚԜ" + "ΑΒΕΖΗΙΚΜΝΟΡΤΥΧ"  # Cyrillic, Greek
_AS_LATIN = "ABEKMHOPCTYXSIJQW" + "ABEZHIKMNOPTYX"
_TO_LATIN = str.maketrans(_LOOKALIKES + _LOOKALIKES.lower(), _AS_LATIN + _AS_LATIN.lower())
_FOLDABLE_CHARS = "".join(chr(code) for code in _TO_LATIN)
_ANY_FOLDABLE = re.compile(f"[{_FOLDABLE_CHARS}]")
# A token: letters and digits, joined by the marks codes are written with ("H-558", "RX/7", "v2.1")
_CODE_TOKEN = re.compile(r"[^\W_]+(?:[-‐‑/._][^\W_]+)*")
_LETTER_RUN = re.compile(r"[^\W\d_]+")
_LATIN_LETTER = re.compile("[A-Za-z]")
_FOLDS_TO_LATIN = re.compile(f"[A-Za-z{_FOLDABLE_CHARS}]+")


def _is_code(token: str) -> bool:
    """A token with a digit, or with Latin letters beside Cyrillic or Greek ones: an identifier."""
    return any(c.isdigit() for c in token) or bool(
        _LATIN_LETTER.search(token) and any(c.isalpha() and not c.isascii() for c in token)
    )


def _fold_code(match: re.Match[str]) -> str:
    token = match.group()
    if not _is_code(token):
        return token
    return _LETTER_RUN.sub(_fold_run, token)


def _fold_run(match: re.Match[str]) -> str:
    run = match.group()
    return run.translate(_TO_LATIN) if _FOLDS_TO_LATIN.fullmatch(run) else run


def fold_homoglyphs(text: str) -> str:
    """The text with Cyrillic and Greek look-alikes of Latin letters written in Latin inside codes.

    OCR with Russian in its languages reads the Latin code "H-558" as "Н-558" (Cyrillic Н), and people
    type codes with whichever keyboard is active: a search must not care. Inside a code (a token with a
    digit, or mixing Latin with Cyrillic or Greek letters), each run of letters that could all be
    Latin is written in Latin ("СО2" -> "CO2", "НOMEPАGE" -> "HOMEPAGE"). Words are left alone, so
    Russian text keeps its words ("Выручка", "СССР") and its stems, and a run with a letter that has
    no Latin look-alike ("5млн", "2024г") stays Cyrillic. One character for one, so offsets hold.
    Index and query both go through it (the lexical indexes, the re-ranker's term match).
    """
    if not _ANY_FOLDABLE.search(text):
        return text
    return _CODE_TOKEN.sub(_fold_code, text)


# The query module's one tokenizer: a number whole ("5.61", "10:30", "53,200"), a word with the
# apostrophes and hyphens inside it ("co-founded"), letters and digits glued ("Q2", "3M") as one.
_TERM = re.compile(r"\d+(?:[.,:]\d+)*(?![^\W_])|[^\W_]+(?:['’-][^\W_]+)*")
_MONTH_NAMES = frozenset(ENGLISH_MONTH_ABBREVIATIONS)
STEM_CHARS = 5


def terms(text: str, drop: frozenset[str] = frozenset()) -> list[str]:
    """The words and numbers of a text as every term match of the query module sees them (the
    search's rerank, the extractive answer), in order: lower-cased, a possessive cut, a month named
    in full shortened as chart axes write it, a number whole, a code with its look-alike letters in
    Latin (`fold_homoglyphs`); words in `drop` left out; Chinese,
    Japanese and Korean as character bigrams (their words have no spaces).
    """
    found = cjk_bigrams(without_chinese_stop_words(text))
    for token in _TERM.findall(CJK_RUN.sub(" ", fold_homoglyphs(text))):
        word = token.lower().removesuffix("'s").removesuffix("’s")
        if word not in drop:
            found.append(ENGLISH_MONTH_ABBREVIATIONS.get(word, word))
    return found


def term_set(text: str) -> frozenset[str]:
    """`set(terms(text))`, with set operations in place of a loop over every token: a search compares
    the question with a few hundred candidate texts. The text is lower-cased whole where that keeps
    its length (every character one for one, so the tokens are the same), not token by token."""
    cjk = bool(CJK_RUN.search(text))
    bigrams = cjk_bigrams(without_chinese_stop_words(text)) if cjk else []
    folded = CJK_RUN.sub(" ", fold_homoglyphs(text)) if cjk else fold_homoglyphs(text)
    lowered = folded.lower()
    if len(lowered) == len(folded):
        words = _lowered_terms(lowered)
    else:  # "İ" lowers to two characters
        words = _normalized({token.lower() for token in _TERM.findall(folded)})
    return frozenset(words.union(bigrams))


def _lowered_terms(lowered: str) -> set[str]:
    """The terms of a folded, lower-cased text without CJK runs."""
    return _normalized(set(_TERM.findall(lowered)))


def _normalized(words: set[str]) -> set[str]:
    """Lower-cased tokens as terms: a possessive cut, a month named in full shortened."""
    possessive = [word for word in words if word.endswith(("'s", "’s"))]
    if possessive:
        words.difference_update(possessive)
        words.update(word.removesuffix("'s").removesuffix("’s") for word in possessive)
    if months := words & _MONTH_NAMES:
        words = (words - months) | {ENGLISH_MONTH_ABBREVIATIONS[month] for month in months}
    return words


_RUN_PUNCTUATION = frozenset(".,:'’-")  # what a term holds besides letters and digits


def _in_run(character: str) -> bool:
    return character.isalnum() or character in _RUN_PUNCTUATION


def held_terms(text: str, wanted: frozenset[str]) -> frozenset[str]:
    """`term_set(text) & wanted`, reading only around where each wanted term occurs.

    A search asks a few hundred candidate texts which of the question's handful of terms each holds;
    tokenizing every text whole was most of a search's Python time. No term spans more than a run of
    letters, digits and `.,:'’-`, and a run tokenizes alone as it does in its text, so each
    occurrence of a wanted term (a substring of the folded, lower-cased text) is checked by
    tokenizing the run around it. Texts with CJK runs, or whose lower case changes length, take the
    whole way.
    """
    if not wanted:
        return frozenset()
    if text.isascii():  # nothing to fold, no CJK, lower case one for one: no scan needed to know
        lowered = text.lower()
    else:
        folded = fold_homoglyphs(text)
        lowered = folded.lower()
        if len(lowered) != len(folded) or CJK_RUN.search(text):
            return term_set(text) & wanted
    found = set()
    for term in wanted:
        at = lowered.find(term) if term else -1  # no term is empty
        while at >= 0:
            start, end = at, at + len(term)
            while start and _in_run(lowered[start - 1]):
                start -= 1
            while end < len(lowered) and _in_run(lowered[end]):
                end += 1
            if term in _lowered_terms(lowered[start:end]):
                found.add(term)
                break
            at = lowered.find(term, max(end, at + 1))
    return frozenset(found)


def query_terms(text: str) -> list[str]:
    """What a question asks about: its terms without stop words and question words, once each."""
    return list(dict.fromkeys(terms(text, NOT_QUERY_TERMS)))


def stem(term: str) -> str:
    """A word cut to five letters ("approved" ~ "approve", "выручки" ~ "выручка"); a number or a
    term with digits as it is. The extractive answer matches a sentence's words to a question's
    this loosely; the search's rerank does not, because a report series tells its quarters and
    products apart by exact words (on the generated set, stems cost image R@5 0.933 -> 0.913)."""
    return term[:STEM_CHARS] if term.isalpha() else term
