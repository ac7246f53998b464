"""Vocab (the tokenizers' id <-> text map) and the StringArray it stores texts in: the same answers as a dict, on the
real 262k-token Gemma vocabulary and on generated ones; duplicate texts are a clear GGUFError."""
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bolt_ros.engine.gguf.reader import GGUFError, StringArray
from bolt_ros.engine.text.vocab import Vocab

texts = st.text(st.characters(codec="utf-8") | st.sampled_from("▁\n \udc80\udcff"), max_size=6)


@settings(max_examples=150, deadline=None)
@given(st.lists(texts, unique=True, min_size=1, max_size=40), st.lists(texts, max_size=20))
def test_vocab_answers_like_a_dict(tokens, queries):
    vocab = Vocab(tokens)  # small vocabularies: several ids share a hash bucket
    expect = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens)
    for q in tokens + queries:
        assert vocab.get(q) == expect.get(q)
        assert (q in vocab) == (q in expect)
    for i, t in enumerate(tokens):
        assert vocab.text(i) == t and vocab[t] == i
    with pytest.raises(KeyError):
        vocab["x" * 7]  # longer than any generated token


def test_every_real_token_finds_its_id(real_ggufs):
    for gf in real_ggufs.values():
        tokens = gf.metadata["tokenizer.ggml.tokens"]
        assert isinstance(tokens, StringArray)
        vocab = Vocab(tokens)
        assert all(vocab.get(t) == i for i, t in enumerate(tokens))
        assert vocab.get("▁definitely-not-one-token-▁") is None and vocab.get("", -1) == -1


def test_duplicate_texts_are_refused():
    with pytest.raises(GGUFError, match=r"duplicate token .*'b' \(ids 1 and 3\)"):
        Vocab(["a", "b", "c", "b"])


def test_string_array_is_a_sequence_of_its_strings():
    strings = ["", "a", "é", "🤖x", "\udcff\udc80", "", "▁the"]
    arr = StringArray.from_strings(strings)
    assert len(arr) == len(strings) and list(arr) == strings and arr == strings and arr != strings[:-1]
    assert [arr[i] for i in range(-len(strings), 0)] == strings and arr[1:4] == strings[1:4]
    assert arr.raw(4) == b"\xff\x80" and arr.byte_lengths().tolist() == [0, 1, 2, 5, 2, 0, 6]
    with pytest.raises(IndexError):
        arr[len(strings)]
