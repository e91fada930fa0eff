"""The detector's per-text work done in bulk (issue 30) equals the per-line code it replaced
(tests/oracles/detect_ref.py) on adversarial text: blank and whitespace-only lines, CR and CRLF, blank runs
of every kind, Unicode whitespace, text that is not NFC (combining marks after newlines and carriage
returns), lone surrogates, one-line and pretty-printed JSON, lists of every kind, the MAX_CHARS boundary,
empty and huge text. Values and their types are compared: a flag must stay an int, not a bool."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixscan.detect import content as content_mod
from prefixscan.detect import list_order as lo
from prefixscan.detect import normalisation as nz
from prefixscan.detect.content import ContentMemo, tenant_salt
from prefixscan.read.record import Record
from tests.oracles import detect_ref as ref

FRAGMENTS = [
    "\n", "\n", "\n", "\r\n", "\r", " ", "  ", "\t", "\u00a0", " \u00a0", "\u2003", "\x0b", "\x0c", "\x1c", "\x85",
    "\u2028", "word", "Second line with text", "x" * 60, "{", "}", "[", "]", '{"b": 2, "a": 1}', "[1, 2,  3]",
    '{\n  "b": 1,\n  "a": [1, 2]\n}', "[\n  {\"name\": \"b\"},\n  {\"name\": \"a\"}\n]", "{not json", "- ", "* ",
    "\u2022 ", "1. ", "2) ", "[3] ", "#4: ", "Document 5: ", "chunk #6 - ", "---", "***", "===", "___",
    "Documents:", "## Heading", "e\u0301", "\u0301", "\u0308", "caf\u00e9", "\u00c5", "A\u030a", "\u1100\u1161",
    "\ud800", "\udfff", "\u0000", "한국어", "日本語", "\U0001f600", ":", ",",
]


def texts(max_size: int = 60) -> st.SearchStrategy[str]:
    return st.lists(st.sampled_from(FRAGMENTS), max_size=max_size).map("".join)


def typed(units: list) -> list:
    """Units with the type of each value, so an int and a bool of equal value differ."""
    return [tuple((type(v), v) for v in u) for u in units]


def fresh(text: str) -> str:
    """An equal text that is a new object (the Lines of the last text are kept by identity)."""
    return "".join(list(text))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts(), st.integers(0, 5), st.sampled_from([0, 1, 2, 3, 2**63 - 1]))
def test_message_units_equal_the_per_line_code(text: str, mi: int, seed: int) -> None:
    want = ref.message_units(mi, text, seed)
    assert typed(nz.message_units(mi, fresh(text), seed)) == typed(want)
    units, norm, raw, length = nz.message_columns(mi, fresh(text), seed)
    assert (typed(units), norm, raw, length) == (typed(want), *ref.piece_columns(want))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts())
def test_paragraph_hashes_equal_the_per_line_code(text: str) -> None:
    assert nz.paragraph_hash(text) == ref.paragraph_hash(text)
    assert nz.paragraph_hash(text, 7) == ref.paragraph_hash(text, 7)
    paras = nz.paragraphs(text)
    assert nz.paragraph_hashes(nz.lines_of(text), paras) == [ref.paragraph_hash(text[s:e]) for s, e in paras]


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(texts(12), min_size=3, max_size=12), texts(10))
def test_the_rag_check_equals_the_per_line_code(paras: list[str], question: str) -> None:
    """First user messages with enough paragraphs (documents, then a question) for the RAG-order check;
    the check reads the Lines the message's units computed."""
    text = "\n\n".join(p + "y" * 40 for p in paras) + "\n\n" + question
    head = content_mod._rag_head(text)
    want = None if head is None else ref.paragraph_hashes(head)
    got = None if head is None else content_mod._paragraph_hashes(head, fresh(text))
    assert got == want
    t = fresh(text)
    units = nz.message_units(2, t, 2)  # leaves its Lines for the check to read
    assert (None if head is None else content_mod._paragraph_hashes(head, t)) == want
    assert typed(units) == typed(ref.message_units(2, text, 2))


def test_lines_at_the_max_chars_boundary() -> None:
    """The last unit is the line that starts before MAX_CHARS, read to its end; a JSON block may not
    start past it; a text with no newline after the bound is read to its end."""
    rng = random.Random(30)
    n = nz.MAX_CHARS
    bodies = ["a" * (n - 1) + "\nbc\nd", "a" * n + "\nb", "a" * (n - 1) + "\n\nb",
              "a" * (n - 2) + "\n{\n \"a\": 1\n}\n", "a" * (n + 5), "a" * (n - 1) + "\n",
              "a" * (n - 1) + "\r\n  b  \n", "\n" * (n + 3) + "z"]
    for _ in range(60):
        parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(4000, 9000))]
        bodies.append("".join(parts))
        cut = rng.randint(n - 40, n + 40)
        bodies.append("b" * cut + "\n" + "".join(parts[:200]))
    for mi, text in enumerate(bodies):
        assert typed(nz.message_units(mi, fresh(text), 3)) == typed(ref.message_units(mi, text, 3))
        assert nz.paragraph_hash(text) == ref.paragraph_hash(text)


def test_empty_and_blank_texts() -> None:
    for text in ["", "\n", "\n\n", " ", "\r\n", " \t\u00a0\n\x0c\n", "\ud800"]:
        assert typed(nz.message_units(0, text, 1)) == typed(ref.message_units(0, text, 1))
        assert nz.paragraph_hash(text) == ref.paragraph_hash(text)


def test_the_kept_lines_are_never_changed_by_their_readers() -> None:
    """message_units and the RAG check share a text's Lines (kept by identity): neither may change them."""
    text = "Intro  line\r\n\n\n{\n  \"a\": 1\n}\n\ne\u0301\n" * 40 + "\n\nquestion?"
    before = nz.leading_lines(text)[0]
    saved = [list(c) for c in before]
    first = nz.message_units(0, text, 1)
    head = content_mod._rag_head(text)
    assert head is not None
    hashes = content_mod._paragraph_hashes(head, text)
    assert [list(c) for c in nz.leading_lines(text)[0]] == saved
    assert nz.message_units(0, text, 1) == first == ref.message_units(0, text, 1)
    assert hashes == ref.paragraph_hashes(head)


def test_lists_are_memoised_by_piece_and_equal_find_lists() -> None:
    """A tenant's system prompt in many new conversations: its lists are found once, and every content
    holds what find_lists gives."""
    system = "Tools:\n\n1. search the web\n2. read a file\n3. write a file\n\n---\nchunk a\n---\nchunk b\n---\nc\n"
    memo = ContentMemo(1 << 20)
    calls = []
    real = content_mod.find_lists

    def counting(text: str, chunks: bool = True) -> list[lo.TextList]:
        calls.append(chunks)
        return real(text, chunks)

    content_mod.find_lists = counting
    try:
        for i in range(5):
            question = f'q{i} [{{"id": 2}}, {{"id": 1}}, {{"id": 3}}]'
            rec = Record("", 0, f"r{i}", 0.0, "chat", tenant="t", messages=[
                {"role": "system", "content": system}, {"role": "user", "content": question}])
            _, c = memo.of(rec, tenant_salt("t"))
            assert [tl for _, tl, _, _ in c.lists] == lo.find_lists(system) + lo.find_lists(question, False)
    finally:
        content_mod.find_lists = real
    assert calls.count(True) == 1 and calls.count(False) == 5


LIST_FRAGMENTS = ["\n", "\n", "\n", "\n\n", "\r\n", " ", "\t", "  \n", " \t\r\n", "- ", "* ", "\u2022 ", "1. ", "2) ",
                  "[3] ", "#4: ", "#5 ", "Document 6: ", "doc 7 - ", "SOURCE #8) ", "chunk 9", "passage 10: ",
                  "result 11. ", "1234. ", "---", "----", "***", "===", "___", "-- -", "Documents:", "## Head",
                  "item text", "x", "\u2003", "\x0c", "\u00a0", "[1, 2]", '[{"a": 1}, {"a": 2}, {"a": 3}]', ":", "."]


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(LIST_FRAGMENTS), max_size=80).map("".join))
def test_list_finders_equal_the_per_item_code(text: str) -> None:
    assert lo._numbered(text) == ref.numbered(text)
    assert lo._separated(text) == ref.separated(text)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), max_size=40), st.integers(0, 2**64 - 1))
def test_order_signature_packs_as_numpy_did(hs: list[int], seed: int) -> None:
    assert lo.order_signature(tuple(hs), seed) == ref.order_signature(tuple(hs), seed)


JSON_LINES = ["{", "[", "  {", "  [", "\t{", "\u2003{", '{"a": 1,', "[1,", "}", "]", "},", "],", "}, ,", "} ,", "  }",
              "  ]", "\t}", "\u2003}", "}\r", "\r}", "  },,", "}x", '"a": 1', '  "b": [1, 2]', "1,", "2", "",
              " ", "{}", "[]", '{"k": "v"}', "} // end"]


def _line_starts(text: str) -> list[int]:
    return [0] + [i + 1 for i, c in enumerate(text) if c == "\n"]


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(JSON_LINES), max_size=40).map("\n".join), st.integers(0, 400))
def test_json_blocks_equal_the_line_by_line_search(text: str, cut: int) -> None:
    n = min(len(text), cut if cut < 400 else len(text))
    for pos in _line_starts(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl + 1
        line = text[pos:end].rstrip("\n")
        assert nz._json_block(text, pos, end, line, n) == ref.json_block(text, pos, end, line, n)


def test_json_blocks_at_their_line_and_size_bounds() -> None:
    """A block closing on its 399th, 400th or 401st line, or just within or past MAX_JSON_CHARS."""
    for lines in (nz.MAX_JSON_LINES - 1, nz.MAX_JSON_LINES, nz.MAX_JSON_LINES + 1):
        text = "{\n" + "".join(f'  "k{i}": {i},\n' for i in range(lines - 1)) + '  "z": 0\n}\ntail'
        for n in (len(text), len(text) - 6, 30):
            assert nz._json_block(text, 0, 2, "{", n) == ref.json_block(text, 0, 2, "{", n)
    for size in range(nz.MAX_JSON_CHARS - 12, nz.MAX_JSON_CHARS + 12):
        text = '[\n "' + "a" * (size - 5) + '"\n]\n'
        text2 = '[\n "' + "a" * (size - 5) + '"\n ]\n]\n'
        for t in (text, text2):
            assert nz._json_block(t, 0, 2, "[", len(t)) == ref.json_block(t, 0, 2, "[", len(t))


@settings(max_examples=2500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["\n", "\n", "\n", " ", "\t", "\r", "\x0c", "\u2003", "a", "b c", "{", "e\u0301"]),
                max_size=40).map("".join))
def test_paragraphs_by_lines_equal_the_regex(body: str) -> None:
    """A text whose every line ends with a newline (as a RAG head does): its paragraphs found from its lines
    equal those `_PARA` finds, and so do their hashes."""
    text = body + "\n"
    tab = nz.lines_of(text[:-1])
    paras = nz.line_paragraphs(tab, len(tab.lines))
    assert [(tab.starts[a], tab.starts[b]) for a, b in paras] == nz.paragraphs(text)
    assert nz.line_paragraph_hashes(tab, paras) == [ref.paragraph_hash(text[s:e]) for s, e in nz.paragraphs(text)]
