"""The recursive splitter never breaks an image annotation, loses no text and keeps pieces within size."""

from __future__ import annotations

import string
from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vision_rag_pipeline.chunks.annotations import ANNOTATION_RE, annotation, find_annotations
from vision_rag_pipeline.chunks.splitter import TextPiece, split_text

# words never contain "[" so the only "![" of a generated text are the annotations' own
WORD_ALPHABET = string.ascii_letters + string.digits + "!().,;:?-'\"]\\/é中"
words = st.text(WORD_ALPHABET, min_size=1, max_size=12)
descriptions = st.text(
    st.one_of(st.sampled_from("[]()\\\n\t !"), st.characters(codec="utf-8", categories=("L", "N"))),
    max_size=400,
)
urls = st.builds(
    "https://{}.example/{}".format,
    st.text(string.ascii_lowercase, min_size=1, max_size=10),
    st.text(string.ascii_letters + "/ ()[]._-%", max_size=60),
)
annotations = st.builds(annotation, descriptions, urls)
joiners = st.sampled_from([" ", " ", " ", "\n", "\n\n", "", "  ", " \n", "\n\n\n"])
texts = st.lists(st.tuples(st.one_of(words, words, words, annotations), joiners), max_size=80).map(
    lambda parts: "".join(token + joiner for token, joiner in parts)
)


@st.composite
def sizes(draw: st.DrawFn) -> tuple[int, int]:
    chunk_size = draw(st.integers(20, 400))
    return chunk_size, draw(st.integers(0, chunk_size - 1))


def annotation_frame_length(url: str) -> int:
    return len(f"![]({url})")


def assert_pieces_are_sound(text: str, chunk_size: int, pieces: list[TextPiece]) -> None:
    """Every property a user of the pieces relies on (see the module docstring)."""
    found = find_annotations(text)
    plain = [piece for piece in pieces if not piece.rewrapped]
    covered = bytearray(len(text))

    # pieces are in text order
    assert [piece.start for piece in pieces] == sorted(piece.start for piece in pieces)

    for piece in plain:
        # a plain piece is exactly the region of the text it claims
        assert text[piece.start : piece.end] == piece.text
        covered[piece.start : piece.end] = b"\x01" * (piece.end - piece.start)
        # no annotation is cut: each is either wholly inside the piece or wholly outside
        for image in found:
            assert (
                image.end <= piece.start
                or image.start >= piece.end
                or (piece.start <= image.start and image.end <= piece.end)
            ), (piece, image)
        # every "![" in a piece starts a complete annotation
        starts = {image.start for image in find_annotations(piece.text)}
        assert {i for i in range(len(piece.text)) if piece.text.startswith("![", i)} == starts

    for piece in pieces:
        if piece.rewrapped:
            # a re-wrapped part is one valid annotation carrying the URL of the annotation it comes from
            (source,) = [image for image in found if image.start < piece.start and piece.end < image.end]
            match = ANNOTATION_RE.fullmatch(piece.text)
            assert match is not None and match["url"] == source.url
            assert piece.text == annotation(text[piece.start : piece.end], source.url)
            covered[source.start : source.end] = b"\x01" * (source.end - source.start)
            covered[source.start + 2 : source.end - len(source.url) - 3] = bytes(len(source.description))
        if len(piece.text) > chunk_size:
            # only an annotation whose URL leaves no room for a description may exceed chunk_size
            match = ANNOTATION_RE.fullmatch(piece.text)
            assert match is not None and annotation_frame_length(match["url"]) >= chunk_size, piece
    for piece in pieces:
        if piece.rewrapped:
            covered[piece.start : piece.end] = b"\x01" * (piece.end - piece.start)

    # no text is lost: every non-whitespace character is covered by some piece
    lost = [i for i, char in enumerate(text) if not covered[i] and not char.isspace()]
    assert not lost, f"lost {[text[i] for i in lost][:20]}"

    for image in found:
        image_text = text[image.start : image.end]
        assert any(image.url in piece.text for piece in pieces), image
        if len(image_text) <= chunk_size:
            assert any(image_text in piece.text for piece in plain), image

    # every whitespace-delimited word that fits (and is not glued to an annotation) appears whole
    masked = list(text)
    for image in found:
        masked[image.start : image.end] = "\0" * (image.end - image.start)
    for word in "".join(masked).split():
        if "\0" not in word and len(word) <= chunk_size:
            assert any(word in piece.text for piece in plain), word


@settings(max_examples=150, deadline=None)
@given(texts, sizes())
def test_split_text_never_breaks_annotations_and_loses_nothing(text: str, size: tuple[int, int]) -> None:
    chunk_size, chunk_overlap = size
    pieces = split_text(text, chunk_size, chunk_overlap)
    assert_pieces_are_sound(text, chunk_size, pieces)
    assert all(piece.text and piece.text == piece.text.strip() for piece in pieces)
    assert split_text(text, chunk_size, chunk_overlap) == pieces


@settings(max_examples=50, deadline=None)
@given(st.lists(annotations, min_size=1, max_size=30).map(" ".join), sizes())
def test_split_text_of_annotations_only(text: str, size: tuple[int, int]) -> None:
    chunk_size, chunk_overlap = size
    assert_pieces_are_sound(text, chunk_size, split_text(text, chunk_size, chunk_overlap))


@settings(max_examples=200)
@given(descriptions, urls)
def test_annotation_round_trips_through_find_annotations(description: str, url: str) -> None:
    written = annotation(description, url)
    (found,) = find_annotations(f"before {written} after")
    assert (found.start, found.end) == (len("before "), len("before ") + len(written))
    assert unquote(found.url) == unquote(url.strip())
    image_name = unquote(url.strip().rstrip("/").rsplit("/", 1)[-1])
    assert found.description == (cleaned(description) or cleaned(image_name) or "image")


def cleaned(description: str) -> str:
    """What a description is expected to become: one line, no brackets, no backslashes."""
    return " ".join(description.replace("\\", "").replace("[", "(").replace("]", ")").split())


def test_annotation_without_description_is_named_after_the_image() -> None:
    assert annotation("", "https://x.example/photos/cat%20one.png?w=2#top") == (
        "![cat one.png](https://x.example/photos/cat%20one.png?w=2#top)"
    )
    assert annotation(" \n", "data:image/png;base64,iVBORw0KGgo=") == (
        "![image/png](data:image/png;base64,iVBORw0KGgo=)"
    )


def test_annotation_needs_a_url() -> None:
    with pytest.raises(ValueError, match="needs a URL"):
        annotation("a cat", "  ")


def test_annotation_that_would_straddle_a_boundary_moves_whole_into_the_next_piece() -> None:
    image = annotation("a cat on a mat", "https://x.example/cat.png")
    text = "one two three four five six seven " + image + " end"
    pieces = split_text(text, chunk_size=50, chunk_overlap=0)
    assert [piece.text for piece in pieces] == ["one two three four five six seven", image + " end"]


def test_overlap_carries_whole_annotations_only() -> None:
    image = annotation("first", "https://x.example/1.png")
    text = f"alpha beta gamma {image} delta epsilon zeta eta"
    pieces = split_text(text, chunk_size=60, chunk_overlap=40)
    assert [piece.text for piece in pieces] == [
        f"alpha beta gamma {image} delta",
        f"{image} delta epsilon zeta eta",
    ]


def test_long_description_is_rewrapped_in_parts_with_the_same_url() -> None:
    url = "https://x.example/img/diagram.png"
    description = " ".join(f"component{i} connects to bus{i % 7}" for i in range(30))
    text = "Figure 3. " + annotation(description, url) + "\n\nNext paragraph."
    pieces = split_text(text, chunk_size=100, chunk_overlap=10)
    parts = [piece for piece in pieces if piece.rewrapped]
    assert len(parts) > 5
    assert all(len(part.text) <= 100 for part in parts)
    assert {find_annotations(part.text)[0].url for part in parts} == {url}
    described = " ".join(find_annotations(part.text)[0].description for part in parts)
    assert all(word in described.split() for word in description.split())
    assert pieces[0].text == "Figure 3." and pieces[-1].text == "Next paragraph."


def test_annotation_whose_url_exceeds_chunk_size_is_kept_whole() -> None:
    image = annotation("a chart", "https://x.example/" + "a" * 80 + ".png")
    pieces = split_text(f"before {image} after", chunk_size=40, chunk_overlap=5)
    assert [piece.text for piece in pieces] == ["before", image, "after"]


def test_plain_text_matches_recursive_character_splitting() -> None:
    text = "aaa bbb ccc\n\nddd eee fff ggg\nhhh"
    assert [piece.text for piece in split_text(text, 12, 4)] == [
        "aaa bbb ccc",
        "ddd eee fff",
        "fff ggg",
        "hhh",
    ]


@pytest.mark.parametrize(("chunk_size", "chunk_overlap"), [(0, 0), (10, 10), (10, -1)])
def test_bad_sizes_are_rejected(chunk_size: int, chunk_overlap: int) -> None:
    with pytest.raises(ValueError, match="chunk_"):
        split_text("text", chunk_size, chunk_overlap)
