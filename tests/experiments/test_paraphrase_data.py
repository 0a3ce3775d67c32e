"""The hand-written paraphrase pairs (data/paraphrases.tsv): the file parses, every field is a
plain one-line sentence of 6 to 20 words, nothing is repeated, and every paraphrase really rewords its sentence."""

import importlib.resources
import re

import pytest

N_PAIRS = 320
HEADER = ["id", "sentence", "paraphrase"]


def _words(text):
    """Lowercased words with punctuation removed (an apostrophe inside a word is kept: "don't")."""
    return re.findall(r"[a-z0-9]+(?:'[a-z0-9]+)*", text.lower().replace("\u2019", "'"))


@pytest.fixture(scope="module")
def lines():
    path = importlib.resources.files("mha_tutorial.data") / "paraphrases.tsv"
    text = path.read_text(encoding="utf-8")
    assert text.endswith("\n") and "\r" not in text
    return text[:-1].split("\n")


@pytest.fixture(scope="module")
def rows(lines):
    return [line.split("\t") for line in lines[1:]]


def test_header_row_count_and_ids(lines, rows):
    assert lines[0].split("\t") == HEADER
    assert len(rows) == N_PAIRS
    assert all(len(row) == len(HEADER) for row in rows), "every line needs exactly three tab-separated fields"
    assert [row[0] for row in rows] == [str(i) for i in range(N_PAIRS)]


def test_fields_are_clean_sentences_of_6_to_20_words(rows):
    for row in rows:
        for field in row[1:]:
            assert field and field == field.strip(), row
            assert "\t" not in field and "\n" not in field, row
            assert field.isprintable(), row
            assert 6 <= len(field.split()) <= 20, f"{len(field.split())} words: {field!r}"


def test_no_duplicates_across_both_columns(rows):
    texts = [field for row in rows for field in row[1:]]
    normalised = [" ".join(_words(t)) for t in texts]
    repeated = {t for t in normalised if normalised.count(t) > 1}
    assert not repeated, repeated


def test_paraphrases_reword_their_sentence(rows):
    for _, sentence, paraphrase in rows:
        s, p = _words(sentence), _words(paraphrase)
        assert s != p, f"paraphrase only changes case or punctuation: {sentence!r}"
        jaccard = len(set(s) & set(p)) / len(set(s) | set(p))
        assert jaccard < 0.8, f"near-copy (word-set Jaccard {jaccard:.2f}): {sentence!r} / {paraphrase!r}"
