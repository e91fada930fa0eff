"""The conversation cache (`SegmentEncoder.last`) keeps a prompt's pieces as 16-byte digests, not their text.

A turn resumes from its conversation's previous prompt by comparing its pieces' digests with the stored
ones (`SegmentEncoder._piece_digests`; compiled and pure paths equal). Without the text an entry is about
its token ids, so the same byte budget holds more conversations and more turns resume.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.config import AnalyzeConfig
from prefixscan.encode import core as encode_core
from prefixscan.encode.encoder import Hashed, RecordEncoder
from prefixscan.encode.tokenize import load_tokenizer
from prefixscan.encode.tokenize.base import KEY, LAST_UNIT, SELF_CHECK_FIRST
from prefixscan.read.record import Record
from tests.conftest import compiled

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), database=None)
TEXT = st.one_of(st.sampled_from(["", "a", "<|im_start|>", "\x00special\x00<|im_start|>", "é\n\n", "\ud800x"]),
                 st.text(max_size=12))
SPECIAL = st.sampled_from(["<|im_start|>", "<|im_end|>", "<|endoftext|>"])  # special pieces are control tokens
PIECES = st.lists(st.one_of(st.tuples(st.just(True), SPECIAL), st.tuples(st.just(False), TEXT)), max_size=8)


@pytest.fixture(scope="module")
def seg():
    return load_tokenizer(AnalyzeConfig(inputs=("x",)).tokenizer).seg  # the default (cl100k)


@SETTINGS
@given(PIECES, PIECES, st.booleans())
def test_piece_digests_compiled_equals_pure_and_counts_equal_pieces(seg, new, old_pieces, against) -> None:
    if encode_core._compiled is None:
        pytest.skip("compiled core not built")
    with compiled(False):
        n_old, old = seg._piece_digests(old_pieces, None)
        pure = seg._piece_digests(new, old if against else None)
    with compiled(True):
        assert seg._piece_digests(old_pieces, None) == (n_old, old)
        fast = seg._piece_digests(new, old if against else None)
    assert pure == fast
    i, blob = pure
    assert len(blob) == KEY * i
    if against:
        same = 0
        while same < min(len(new), len(old_pieces)) and new[same] == old_pieces[same]:
            same += 1
        assert i == same  # equal digests exactly where the pieces are equal
    else:
        assert i == len(new)


def test_text_spelling_a_special_keys_input_is_not_that_special(seg) -> None:
    """A special piece's digest is its special key, xxh3-128 of "\\0special\\0" + its text; text spelling
    that input still digests differently (seed 1), so it never resumes as the special token."""
    for on in (False, True):
        with compiled(on):
            _, old = seg._piece_digests([(True, "<|im_start|>")], None)
            assert seg._piece_digests([(False, "\x00special\x00<|im_start|>")], old)[0] == 0
            assert seg._piece_digests([(True, "<|im_start|>")], old)[0] == 1


def _turn(i: int, long: str) -> Record:
    msgs = [{"role": "system", "content": long}]
    for t in range(i):
        msgs += [{"role": "user", "content": f"question {t}"}, {"role": "assistant", "content": f"answer {t}"}]
    msgs.append({"role": "user", "content": f"question {i}"})
    return Record(request_id=f"r{i}", timestamp_s=float(i), kind="chat", source_file="x", source_line=i,
                  messages=msgs, conversation_id="c")


@pytest.mark.parametrize("on", [False, True])
def test_a_remembered_prompt_costs_its_tokens_not_its_text(on) -> None:
    if on and encode_core._compiled is None:
        pytest.skip("compiled core not built")
    enc = RecordEncoder(AnalyzeConfig(inputs=("x",)), keep_tokens=True)
    tok = enc.load()
    tok.checked = SELF_CHECK_FIRST
    long = "word " * 40000  # 200,000 characters, 40,000 tokens (a long system prompt)
    with compiled(on):
        first = enc.encode([_turn(0, long)])[0]
        assert isinstance(first, Hashed)
        last = tok.seg.last
        (entry, size), = last._d.values()
        n_pieces, n_units = len(entry.digests) // KEY, len(entry.lens)
        assert size == first.tokens.nbytes + KEY * n_pieces + LAST_UNIT * n_units < len(long)
        assert not hasattr(entry, "pieces")  # the text is not held
        second = enc.encode([_turn(1, long)])[0]
    assert isinstance(second, Hashed)
    assert second.tokens.tolist() == tok.encode_direct(_turn(1, long)).tolist()
    assert tok.stats.units_resumed > 0  # the second turn resumed from the first
