"""One contract for the lexical index, run against every backend.

tantivy always runs. Elasticsearch runs against the cluster named by `VISION_RAG_ES_URL` when the
test session started with it set, otherwise against the noida-db emulator started on a free
loopback port, otherwise it is skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.chunks.model import Landmarks
from vision_rag_pipeline.core.config import ES_URL_ENV, ElasticsearchSettings
from vision_rag_pipeline.indexes import tantivy_index
from vision_rag_pipeline.indexes.elasticsearch_index import (
    ElasticsearchLexicalIndex,
)
from vision_rag_pipeline.indexes.lexical import LexicalDoc, LexicalIndex, LexicalIndexError
from vision_rag_pipeline.indexes.lexical_backend import open_lexical_index
from vision_rag_pipeline.indexes.tantivy_index import TantivyLexicalIndex, open_tantivy_index
from vision_rag_pipeline_tests import conftest
from vision_rag_pipeline_tests.es_server import EmulatorUnavailable, free_port, noida_elasticsearch

# conftest removes VISION_RAG_ES_URL from the environment so other tests stay embedded; it keeps
# the original value for this suite.
CLUSTER_URL: str | None = getattr(conftest, "ORIGINAL_ES_URL", None)


def doc(chunk_id: str, document_id: str, text: str, kind: str = "text", **extra: object) -> LexicalDoc:
    return LexicalDoc(chunk_id=chunk_id, document_id=document_id, kind=kind, text=text, **extra)


def ids(hits: list) -> list[str]:
    return [hit.chunk_id for hit in hits]


# --- backends --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def es_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if CLUSTER_URL:
        yield CLUSTER_URL
        return
    try:
        with noida_elasticsearch(tmp_path_factory.mktemp("noida")) as url:
            yield url
    except EmulatorUnavailable as exc:
        pytest.skip(f"no Elasticsearch: VISION_RAG_ES_URL unset and the emulator is unavailable: {exc}")


def es_settings(url: str, monkeypatch: pytest.MonkeyPatch) -> ElasticsearchSettings:
    """The session's cluster with its credentials from the environment and a private alias."""
    monkeypatch.setenv(ES_URL_ENV, url)
    base = ElasticsearchSettings.from_env()
    return dataclasses.replace(base, alias=f"vision-rag-test-{uuid.uuid4().hex[:12]}")


def drop_es_indexes(index: ElasticsearchLexicalIndex) -> None:
    client = index.client
    if client.indices.exists_alias(name=index.alias):
        for name in client.indices.get_alias(name=index.alias).body:
            client.indices.delete(index=name, ignore_unavailable=True)
    index.close()


@pytest.fixture(params=["tantivy", "elasticsearch"])
def backend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def index(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LexicalIndex]:
    """A fresh, empty index of the backend under test."""
    if backend == "tantivy":
        yield open_tantivy_index(tmp_path / "lexical")
        return
    url = request.getfixturevalue("es_url")
    es_index = ElasticsearchLexicalIndex(es_settings(url, request.getfixturevalue("monkeypatch")))
    yield es_index
    drop_es_indexes(es_index)


CORPUS = [
    doc(
        "three", "report", "The chart shows sales. A second chart compares regions; the third chart is a map."
    ),
    doc("one", "report", "Quarterly revenue is summarised in one chart at the end of this section."),
    doc("none", "report", "Nothing about graphics here: only prose on accounting principles."),
    doc(
        "photo", "album", "Photo of a chart printed on a poster", kind="image", page=3, image="img/poster.png"
    ),
    doc("zh", "zh-doc", "机器学习模型的训练方法与评估", metadata={"lang": "zh", "nested": {"a": 1}}),
]


def load_corpus(index: LexicalIndex) -> None:
    by_document: dict[str, list[LexicalDoc]] = {}
    for item in CORPUS:
        by_document.setdefault(item.document_id, []).append(item)
    for document_id, docs in by_document.items():
        index.replace_document(document_id, docs)


# --- the contract ----------------------------------------------------------------------------------


def test_a_new_index_is_created_on_first_use_and_empty(index: LexicalIndex) -> None:
    assert index.count() == 0
    assert index.document_ids() == set()
    assert index.search("chart", 5) == []
    index.replace_document("report", CORPUS[:1])
    assert index.count() == 1
    assert index.document_ids() == {"report"}


def test_replacing_a_document_twice_keeps_one_entry_per_chunk(index: LexicalIndex) -> None:
    load_corpus(index)
    total = index.count()
    report = [item for item in CORPUS if item.document_id == "report"]
    index.replace_document("report", report)
    index.replace_document("report", report)
    assert index.count() == total == len(CORPUS)
    assert index.count("report") == 3
    assert ids(index.search("chart", 10)).count("three") == 1


def test_replacing_drops_chunks_the_document_no_longer_has(index: LexicalIndex) -> None:
    load_corpus(index)
    index.replace_document("report", [doc("one", "report", "A single chart remains.")])
    assert index.count("report") == 1
    assert "three" not in ids(index.search("chart", 10))
    index.replace_document("report", [])
    assert index.count("report") == 0
    assert "report" not in index.document_ids()


def test_a_chunk_id_is_unique_across_documents(index: LexicalIndex) -> None:
    index.replace_document("first", [doc("shared", "first", "chart")])
    index.replace_document("second", [doc("shared", "second", "chart")])
    assert index.count() == 1
    assert [(hit.chunk_id, hit.document_id) for hit in index.search("chart", 5)] == [("shared", "second")]


def test_replace_rejects_chunks_of_another_document(index: LexicalIndex) -> None:
    with pytest.raises(ValueError, match="belongs to document 'album'"):
        index.replace_document("report", [CORPUS[3]])
    with pytest.raises(ValueError, match="appears twice"):
        index.replace_document("report", [CORPUS[0], CORPUS[0]])


def test_delete_document_removes_only_that_document(index: LexicalIndex) -> None:
    load_corpus(index)
    assert index.delete_document("report") == 3
    assert index.count("report") == 0
    assert index.count() == len(CORPUS) - 3
    assert index.document_ids() == {"album", "zh-doc"}
    assert ids(index.search("chart", 10)) == ["photo"]
    assert index.delete_document("report") == 0


def test_bm25_ranks_more_mentions_first_and_stems_the_query(index: LexicalIndex) -> None:
    load_corpus(index)
    hits = index.search("charts", 10, kinds=["text"])
    assert ids(hits) == ["three", "one"]
    assert hits[0].score > hits[1].score > 0
    assert hits[0].document_id == "report"


def test_k_limits_the_hits(index: LexicalIndex) -> None:
    load_corpus(index)
    assert ids(index.search("chart", 1)) == ["three"]
    assert index.search("chart", 0) == []


def test_filters_by_document_and_kind(index: LexicalIndex) -> None:
    load_corpus(index)
    assert ids(index.search("chart", 10, document_ids=["album"])) == ["photo"]
    assert ids(index.search("chart", 10, kinds=["image"])) == ["photo"]
    assert ids(index.search("chart", 10, document_ids=["report", "album"], kinds=["image"])) == ["photo"]
    assert sorted(ids(index.search("chart", 10, document_ids=["report", "album"]))) == [
        "one",
        "photo",
        "three",
    ]
    assert index.search("chart", 10, document_ids=["missing"]) == []
    assert index.search("chart", 10, document_ids=[]) == []


def test_the_header_alone_names_the_documents(index: LexicalIndex) -> None:
    """A report series: the same sentence in each quarter's report; only the headers tell them apart,
    and a header-only search scores the headers and nothing else."""
    for quarter in (1, 2):
        header = f"Glimmerfield Solar operations review Q{quarter} 2025"
        index.replace_document(
            f"q{quarter}",
            [
                doc(
                    f"q{quarter}:0",
                    f"q{quarter}",
                    "The Gdansk site passed its safety audit.",
                    landmarks=Landmarks(header=header),
                )
            ],
        )
    index.replace_document("other", [doc("other:0", "other", "The Gdansk site passed its safety audit.")])
    assert set(ids(index.search("Gdansk safety audit", 10))) == {"q1:0", "q2:0", "other:0"}
    assert index.search("Gdansk safety audit", 10, header_only=True) == []
    assert sorted(ids(index.search("Glimmerfield audit", 10, header_only=True))) == ["q1:0", "q2:0"]
    scores = {hit.chunk_id: hit.score for hit in index.search("Glimmerfield Q2 review", 10, header_only=True)}
    assert max(scores, key=scores.get) == "q2:0"


def test_a_filter_does_not_change_the_ranking(index: LexicalIndex) -> None:
    load_corpus(index)
    unfiltered = {hit.chunk_id: hit.score for hit in index.search("chart", 10)}
    filtered = index.search("chart", 10, document_ids=["report"])
    assert [(hit.chunk_id, hit.score) for hit in filtered] == [
        (chunk_id, score) for chunk_id, score in unfiltered.items() if chunk_id in {"three", "one"}
    ]


KINDS_CORPUS = [
    doc("r:t", "report", "Revenue chart and revenue table for the quarter"),
    doc("r:tab", "report", "Revenue by region table", kind="table", page=2),
    doc("r:img", "report", "Chart of revenue", kind="image", page=2, image="img/rev.png"),
    doc("r:p2", "report", "Revenue by region table. Chart of revenue", kind="page", page=2),
    doc("a:t", "album", "A revenue poster", page=1),
    doc("a:img", "album", "Photo of a revenue chart", kind="image", page=1, image="img/poster.png"),
    doc("a:p1", "album", "A revenue poster. Photo of a revenue chart", kind="page", page=1),
    doc("m:t", "memo", "The board discussed revenue"),
]


def test_any_filter_keeps_exactly_the_hits_that_satisfy_it_with_their_scores(index: LexicalIndex) -> None:
    """Whatever documents and kinds a search keeps (every subset of the kinds an index holds, page
    units among them), it returns the unfiltered hits that satisfy the filter, in their order, with
    their scores."""
    for document_id in ("report", "album", "memo"):
        index.replace_document(
            document_id, [item for item in KINDS_CORPUS if item.document_id == document_id]
        )
    kind_of = {item.chunk_id: item.kind for item in KINDS_CORPUS}
    document_of = {item.chunk_id: item.document_id for item in KINDS_CORPUS}
    unfiltered = [(hit.chunk_id, hit.score) for hit in index.search("revenue chart", 20)]
    assert len(unfiltered) == len(KINDS_CORPUS)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        st.none() | st.lists(st.sampled_from(["text", "table", "image", "page"]), min_size=1, unique=True),
        st.none()
        | st.lists(st.sampled_from(["report", "album", "memo", "missing"]), min_size=1, unique=True),
    )
    def filtered_search(kinds: list[str] | None, documents: list[str] | None) -> None:
        hits = index.search("revenue chart", 20, document_ids=documents, kinds=kinds)
        assert [(hit.chunk_id, round(hit.score, 5)) for hit in hits] == [
            (chunk_id, round(score, 5))
            for chunk_id, score in unfiltered
            if (kinds is None or kind_of[chunk_id] in kinds)
            and (documents is None or document_of[chunk_id] in documents)
        ]

    filtered_search()


@pytest.mark.parametrize("query", ["the of and", "?!...", "", "   ", "-- :: ()"])
def test_punctuation_and_stop_words_match_nothing(index: LexicalIndex, query: str) -> None:
    load_corpus(index)
    assert index.search(query, 10) == []


@pytest.mark.parametrize(
    "query",
    [
        "C++ chart",
        '"chart',
        "text: chart",
        "chart AND",
        "(chart",
        "chart^2",
        "chart~",
        "[1 TO chart",
        "{chart}",
        "/chart/",
        "chart*",
        "\\chart",
        "-chart",
        "!chart",
        "chart || sales",
        "document_id:report chart",
    ],
)
def test_query_syntax_in_user_text_is_just_text(index: LexicalIndex, query: str) -> None:
    load_corpus(index)
    assert "three" in ids(index.search(query, 10))


def test_arbitrary_text_never_raises(index: LexicalIndex) -> None:
    load_corpus(index)

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(st.text(max_size=40))
    def search_anything(query: str) -> None:
        for hit in index.search(query, 3):
            assert hit.chunk_id in {item.chunk_id for item in CORPUS}

    search_anything()


def test_chinese_query_matches_the_chinese_chunk(index: LexicalIndex) -> None:
    if isinstance(index, ElasticsearchLexicalIndex):
        index.count()  # creates the index, so its fields are known
        if "text.cjk" not in index._search_fields(index.client):
            pytest.xfail("this Elasticsearch has no `cjk` analyzer; Chinese is matched per character only")
    load_corpus(index)
    assert ids(index.search("学习模型", 5))[:1] == ["zh"]
    assert ids(index.search("评估", 5)) == ["zh"]


def test_an_inflected_russian_query_matches_by_stem(index: LexicalIndex) -> None:
    index.replace_document(
        "ru",
        [
            doc("revenue", "ru", "Выручка компании выросла на 12 процентов."),
            doc("staff", "ru", "Численность персонала не изменилась."),
        ],
    )
    assert ids(index.search("Какой была выручка компаний?", 5))[:1] == ["revenue"]  # выручка ~ выручки
    assert ids(index.search("численности персонала", 5))[:1] == ["staff"]


def test_a_code_matches_whichever_look_alike_letters_either_side_wrote(index: LexicalIndex) -> None:
    # OCR with Russian in its languages wrote the Latin codes with Cyrillic Н, Е and К; the codes share
    # their number, so only the letters tell them apart
    index.replace_document(
        "ru",
        [
            doc("pump", "ru", "Насос \u041d-558 поставлен на склад в марте."),
            doc("valve", "ru", "Клапан \u0415-558 заменён, выручка выросла."),
            doc("filter", "ru", "Фильтр \u041a558 и комплект TX7 отгружены."),
        ],
    )
    assert ids(index.search("H-558", 5))[:1] == ["pump"]  # typed with a Latin keyboard
    assert ids(index.search("E-558", 5))[:1] == ["valve"]
    assert ids(index.search("K558", 5)) == ["filter"]
    assert ids(index.search("\u0422\u0425" + "7", 5)) == ["filter"]  # Cyrillic Т, Х typed for a Latin code
    assert ids(index.search("выручки", 5)) == ["valve"]  # the Russian words around the codes keep their stems


def test_rebuild_swaps_in_the_new_index_while_searches_keep_answering(index: LexicalIndex) -> None:
    load_corpus(index)
    before = ids(index.search("chart", 10))
    answers_during_rebuild: list[list[str]] = []

    def new_corpus() -> Iterator[LexicalDoc]:
        for number, item in enumerate(CORPUS):
            if number == 2:
                answers_during_rebuild.append(ids(index.search("chart", 10)))
            yield item
        yield doc("extra", "appendix", "An appendix chart, chart and chart again: chart.")

    index.rebuild(new_corpus())

    assert answers_during_rebuild == [before]  # the old index, whole
    assert index.count() == len(CORPUS) + 1
    assert ids(index.search("chart", 10))[0] == "extra"
    assert index.document_ids() == {"report", "album", "zh-doc", "appendix"}
    index.replace_document("appendix", [])  # writes go to the new index
    assert index.count() == len(CORPUS)


def stored_versions(index: LexicalIndex) -> list[str]:
    """Every index version the backend keeps on disk or on the cluster."""
    if isinstance(index, TantivyLexicalIndex):
        return sorted(entry.name for entry in index.root.iterdir() if entry.is_dir())
    return sorted(index.client.indices.get(index=f"{index.alias}-v*").body)


def live_versions(index: LexicalIndex) -> list[str]:
    if isinstance(index, TantivyLexicalIndex):
        return [(index.root / tantivy_index.POINTER_FILE).read_text().strip()]
    return sorted(index.client.indices.get_alias(name=index.alias).body)


def test_rebuild_leaves_one_live_version(index: LexicalIndex) -> None:
    load_corpus(index)
    first = live_versions(index)
    index.rebuild(CORPUS)
    index.rebuild(CORPUS[:2])
    assert index.count() == 2
    assert stored_versions(index) == live_versions(index) != first
    assert len(live_versions(index)) == 1


def test_a_failed_rebuild_keeps_the_old_index(index: LexicalIndex) -> None:
    load_corpus(index)
    before = live_versions(index)

    def broken_source() -> Iterator[LexicalDoc]:
        yield CORPUS[0]
        raise OSError("database connection lost")

    with pytest.raises(OSError, match="connection lost"):
        index.rebuild(broken_source())
    assert index.count() == len(CORPUS)
    assert stored_versions(index) == live_versions(index) == before


# --- Elasticsearch errors --------------------------------------------------------------------------


def test_two_processes_creating_the_alias_at_once_both_use_it(
    es_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two ingests on two nodes made the alias at the same moment; one took it for a concrete index."""
    settings_ = es_settings(es_url, monkeypatch)
    first, second = ElasticsearchLexicalIndex(settings_), ElasticsearchLexicalIndex(settings_)
    looked = first.client.indices.exists_alias

    def other_process_creates_it_right_after(**kwargs: object) -> bool:
        answer = looked(**kwargs)
        if not answer:
            second.count()
        return bool(answer)

    monkeypatch.setattr(first.client.indices, "exists_alias", other_process_creates_it_right_after)
    try:
        assert first.count() == 0
    finally:
        drop_es_indexes(second)


def test_elasticsearch_down_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    settings_ = dataclasses.replace(es_settings(url, monkeypatch), username="elastic", password="s3cret-pw")
    down = ElasticsearchLexicalIndex(settings_)
    with pytest.raises(
        LexicalIndexError, match=r"Elasticsearch at http://127\.0\.0\.1:\d+ is unreachable"
    ) as err:
        down.search("chart", 5)
    assert "\n" not in str(err.value) and "s3cret-pw" not in str(err.value)
    assert "s3cret-pw" not in repr(settings_)
    with pytest.raises(LexicalIndexError, match="unreachable"):
        down.replace_document("report", CORPUS[:1])


def test_elasticsearch_bad_credentials_are_one_clear_error(
    es_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bogus_key = "Ym9ndXM6a2V5LW5vdC12YWxpZA=="
    settings_ = dataclasses.replace(es_settings(es_url, monkeypatch), api_key=bogus_key, username=None)
    rejected = ElasticsearchLexicalIndex(settings_)
    try:
        rejected.client.info()
    except Exception:  # noqa: BLE001 - any refusal means the server checks credentials
        pass
    else:
        pytest.skip(f"{settings_.safe_url} does not enforce authentication (noida-db has one implicit login)")
    finally:
        rejected.close()
    with pytest.raises(LexicalIndexError, match="rejected the credentials") as err:
        rejected.count()
    assert bogus_key not in str(err.value)


def test_a_plain_index_under_the_alias_name_is_refused(es_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    clash = ElasticsearchLexicalIndex(es_settings(es_url, monkeypatch))
    clash.client.indices.create(index=clash.alias)
    try:
        with pytest.raises(LexicalIndexError, match="is a concrete index, not an alias"):
            clash.count()
    finally:
        clash.client.indices.delete(index=clash.alias)
        clash.close()


# --- tantivy: several handles and processes --------------------------------------------------------


def test_another_handle_sees_commits_and_rebuilds(tmp_path: Path) -> None:
    writer = TantivyLexicalIndex(tmp_path / "lexical")
    reader = TantivyLexicalIndex(tmp_path / "lexical")  # what another process holds
    writer.replace_document("report", CORPUS[:2])
    assert ids(reader.search("chart", 10)) == ["three", "one"]
    writer.rebuild(CORPUS[3:4])
    assert ids(reader.search("chart", 10)) == ["photo"]
    writer.replace_document("report", CORPUS[:1])
    assert reader.count() == 2


def test_a_foreign_tantivy_writer_is_waited_for_then_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = TantivyLexicalIndex(tmp_path / "lexical")
    index.replace_document("report", CORPUS[:1])
    live = index.root / (index.root / tantivy_index.POINTER_FILE).read_text().strip()
    foreign = tantivy_index.Index.open(str(live)).writer(heap_size=15_000_000, num_threads=1)

    monkeypatch.setattr(tantivy_index, "TANTIVY_LOCK_RETRY_S", 0.2)
    with pytest.raises(LexicalIndexError, match="locked by another writer"):
        index.replace_document("report", CORPUS[:2])

    monkeypatch.setattr(tantivy_index, "TANTIVY_LOCK_RETRY_S", 10.0)
    threading.Timer(0.3, foreign.wait_merging_threads).start()  # the other writer finishes
    index.replace_document("report", CORPUS[:2])
    assert index.count("report") == 2


def test_a_write_locked_by_another_process_times_out_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = TantivyLexicalIndex(tmp_path / "lexical")
    index.replace_document("report", CORPUS[:1])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fasteners, sys, time\n"
            "lock = fasteners.InterProcessLock(sys.argv[1]); lock.acquire(); print('held', flush=True)\n"
            "time.sleep(60)",
            str(index.root / tantivy_index.LOCK_FILE),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(tantivy_index, "WRITE_LOCK_TIMEOUT_S", 0.3)
        with pytest.raises(LexicalIndexError, match="locked by another process"):
            index.replace_document("report", CORPUS[:2])
        assert ids(index.search("chart", 10)) == ["three"]  # reads never wait for the lock
    finally:
        holder.kill()
        holder.wait()
    index.replace_document("report", CORPUS[:2])
    assert index.count() == 2


WRITER_SCRIPT = """
import sys
from pathlib import Path
from vision_rag_pipeline.indexes.lexical import LexicalDoc
from vision_rag_pipeline.indexes.tantivy_index import open_tantivy_index
index = open_tantivy_index(Path(sys.argv[1]))
prefix = sys.argv[2]
for number in range(4):
    document_id = f"{prefix}-{number}"
    chunks = [LexicalDoc(chunk_id=f"{document_id}-{c}", document_id=document_id, kind="text", text="chart")
              for c in range(3)]
    index.replace_document(document_id, chunks)
    index.replace_document(document_id, chunks)
"""


def test_concurrent_writer_processes_lose_nothing(tmp_path: Path) -> None:
    root = tmp_path / "lexical"
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, str(root), prefix], stderr=subprocess.PIPE, text=True
        )
        for prefix in ("a", "b")
    ]
    for writer in writers:
        _, stderr = writer.communicate(timeout=120)
        assert writer.returncode == 0, stderr
    index = TantivyLexicalIndex(root)
    assert index.count() == 2 * 4 * 3
    assert len(index.document_ids()) == 8


# --- the factory -----------------------------------------------------------------------------------


def test_open_lexical_index_defaults_to_tantivy_under_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ES_URL_ENV, raising=False)
    first = open_lexical_index(tmp_path)
    assert isinstance(first, TantivyLexicalIndex)
    assert first.root == (tmp_path / "lexical").resolve()
    assert open_lexical_index(tmp_path) is first  # one handle per process: cheap in the query path
    monkeypatch.setenv("VISION_RAG_HOME", str(tmp_path / "home"))
    assert open_lexical_index().root == (tmp_path / "home" / "lexical").resolve()


def test_open_lexical_index_uses_elasticsearch_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ES_URL_ENV, "https://user:pw@search.example:9200")
    monkeypatch.setenv("VISION_RAG_ES_INDEX", "chunks")
    monkeypatch.setenv("VISION_RAG_ES_VERIFY_CERTS", "false")
    opened = open_lexical_index()
    assert isinstance(opened, ElasticsearchLexicalIndex)
    assert opened.alias == "chunks"
    assert opened.settings.verify_certs is False
    assert opened.settings.safe_url == "https://search.example:9200"


def test_close_then_use_reopens(index: LexicalIndex) -> None:
    load_corpus(index)
    index.close()
    assert ids(index.search("chart", 1)) == ["three"]


def test_an_index_from_before_the_russian_field_says_to_reindex_and_rebuild_fixes_it(tmp_path: Path) -> None:
    import tantivy

    old = tantivy.SchemaBuilder()
    for name in ("chunk_id", "document_id", "image"):
        old.add_text_field(name, stored=True, tokenizer_name="raw")
    old.add_text_field("kind", tokenizer_name="raw")
    old.add_text_field("text", tokenizer_name="en_stem")
    old.add_text_field("text_cjk", tokenizer_name="raw", index_option="freq")
    old.add_unsigned_field("page", stored=True)
    root = tmp_path / "lexical"
    (root / "v-old").mkdir(parents=True)
    tantivy.Index(old.build(), path=str(root / "v-old"))
    (root / "CURRENT").write_text("v-old\n")
    index = TantivyLexicalIndex(root)
    with pytest.raises(LexicalIndexError, match="vision-rag reindex"):
        index.search("chart", 5)
    index.rebuild([doc("ru", "report", "Выручка компании выросла.")])
    assert ids(index.search("выручки", 5)) == ["ru"]
