"""Where a text segment may be cut for the memo: only where the tokenizer provably cannot merge across.

tokenise(A + B) == tokenise(A) + tokenise(B) holds when the pre-tokeniser puts a boundary at the cut in
A + B, splits A alone and B alone into the same pre-tokens as A + B, and every later stage (normaliser,
model) works within a pre-token (BPE, WordPiece, Unigram and tiktoken's BPE all do). So the rule is a
property of the pre-tokeniser's definition, decided once per tokenizer at load time (`rule_for_pattern`,
`rule_for_hf`). Two rules are proven here, each for a listed set of pre-tokenisers (docs/analyze.md):

- before-blank-line: cut before a blank line (`\\n` + whitespace + `\\n`) whose previous character is surely not
  whitespace. GPT-2/r50k regex: no alternative that contains a non-space character continues into
  whitespace, the whitespace run then starts a fresh match, and no alternative looks behind. Whitespace-
  delimited pre-tokenisers (BERT, Whitespace): whitespace always ends a word. A `\\n` on the right of the
  cut is a normalisation starter that composes with nothing, so NFC/NFD (and, for BERT, its normaliser)
  never act across it.
- after-blank-line: cut after a blank line, before a character that is surely not whitespace (and not `/` for
  o200k). cl100k, o200k, Llama 3, Qwen 2, DeepSeek V3: a character before newlines can be absorbed by them
  (`_\\n\\n` and `.\\n\\n` are single tokens), so the old cut before the newlines was wrong; but no
  alternative continues from a newline into a non-space character, the whitespace-and-newline
  alternatives end at the last newline of the run (`\\s*[\\r\\n]`, `\\s*[\\r\\n]+`, or `\\s++$` at the end
  of A alone, over the same span), and nothing looks behind, so B starts a fresh match in both.

"Surely not whitespace" is decided conservatively, since the regex engine's Unicode tables (Rust regex,
Oniguruma) may differ from Python's: the character is not whitespace for Python, not Unicode White_Space,
not one of the characters that were once in Zs, and is assigned in Python's Unicode database.
Any other pre-tokeniser gets no cut inside a segment (`no_cuts`): exact, only less memo reuse. Dropping
safe cuts is always safe, so parts shorter than `MIN_UNIT` are joined to the next.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

# Characters treated as whitespace whatever the engine: Python's str.isspace, Unicode White_Space, and
# the format characters that some Unicode versions or engines class as spaces.
_ODD_SPACE = "\u180e\u200b\u2060\ufeff"
_NONSPACE = rf"[^\s{_ODD_SPACE}]"
_BLANK = r"\n[^\S\n]*\n"  # two newlines with only other whitespace between them (a blank line)


# Cut parts shorter than this (characters) are joined to the next; any subset of safe cuts is safe. Each
# unit costs a memo look-up and an array on every resend, which outweighs tokenising a few more words
# (a 4,000-request synth chat log: 200 -> 105k units, 1,000 -> 70k, no cut inside segments -> 61k).
MIN_UNIT = 1000


def _assigned(c: str) -> bool:
    return c < "\x80" or unicodedata.category(c) not in ("Cn", "Co", "Cs")


@dataclass(frozen=True)
class CutRule:
    """How one tokenizer's segments may be cut: `name` and `why` go in the summary."""

    name: str
    why: str
    split: Callable[[str], list[str]] | None  # None: never cut inside a segment
    min_unit: int = MIN_UNIT

    def parts(self, text: str) -> list[str]:
        """The text cut at this rule's places, parts shorter than `min_unit` joined to the next."""
        if self.split is None or len(text) < 2 * self.min_unit or text.count("\n") < 2:
            return [text]
        out: list[str] = []
        acc = ""
        for part in self.split(text):
            acc += part
            if len(acc) >= self.min_unit:
                out.append(acc)
                acc = ""
        if acc:
            if out:
                out[-1] += acc
            else:
                out.append(acc)
        return out


def _cutter(pattern: str, before: bool) -> Callable[[str], list[str]]:
    rx = re.compile(pattern)

    def split(text: str) -> list[str]:
        out: list[str] = []
        start = 0
        for m in rx.finditer(text):
            i = m.start() if before else m.end()
            if not _assigned(text[i - 1] if before else text[i]):
                continue
            if i > start:
                out.append(text[start:i])
                start = i
        out.append(text[start:])
        return out

    return split


def before_blank() -> Callable[[str], list[str]]:
    return _cutter(rf"(?<={_NONSPACE})\r?{_BLANK}", before=True)


def after_blank(exclude: str = "") -> Callable[[str], list[str]]:
    ex = re.escape(exclude)
    return _cutter(rf"{_BLANK}(?=[^\s{_ODD_SPACE}{ex}])", before=False)


def _rule(name: str, why: str, exclude: str = "") -> CutRule:
    if name == "before-blank-line":
        return CutRule(name, why, before_blank())
    return CutRule(name, why, after_blank(exclude))


def no_cuts(why: str) -> CutRule:
    return CutRule("segments", why, None)


# -- tiktoken: rules by the exact pattern string they were proven for ------------------------------------
GPT2_PATS = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
    r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s""",
)
CL100K_PATS = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
    r"""\s+(?!\S)|\s+""",
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|"""
    r"""\s*[\r\n]|\s+(?!\S)|\s""",
)
O200K_PAT = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])
# Llama 3 (= the first cl100k form), Qwen 2 (digits one at a time), and DeepSeek V3's three Splits.
QWEN2_PAT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"""
             r"""\s+(?!\S)|\s+""")
DEEPSEEK_PATS = (
    r"""\p{N}{1,3}""",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+"
    "[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)


def rule_for_pattern(pat: str) -> CutRule:
    """The cut rule for a tiktoken-style pre-tokeniser regex (no cuts for a pattern not analysed)."""
    if pat in GPT2_PATS:
        return _rule("before-blank-line", "GPT-2 pre-tokeniser regex")
    if pat in CL100K_PATS:
        return _rule("after-blank-line", "cl100k / Llama 3 pre-tokeniser regex")
    if pat == O200K_PAT:
        return _rule("after-blank-line", "o200k pre-tokeniser regex (not before '/')", exclude="/")
    return no_cuts("pre-tokeniser regex not analysed for cuts: the memo works on whole segments")


# -- Hugging Face tokenizers: from the tokenizer.json pipeline ------------------------------------------
AFTER_SAFE_SPLITS = {*CL100K_PATS, O200K_PAT, QWEN2_PAT, *DEEPSEEK_PATS}
_NORM_BYTELEVEL = {"NFC", "NFD"}  # canonical forms: never turn a non-space into a space
_NORM_WORDS = {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "BertNormalizer"}
_WORD_PRE = {"BertPreTokenizer", "Whitespace", "WhitespaceSplit"}


def _flat(node: dict[str, Any] | None, key: str) -> list[dict[str, Any]] | None:
    """A normaliser or pre-tokeniser as a flat list of steps (Sequence unrolled); None when absent."""
    if node is None:
        return []
    if node.get("type") == "Sequence":
        out: list[dict[str, Any]] = []
        for sub in node.get(key, []):
            got = _flat(sub, key)
            if got is None:
                return None
            out += got
        return out
    return [node]


def _norm_ok(steps: list[dict[str, Any]] | None, allowed: set[str]) -> bool:
    return steps is not None and all(s.get("type") in allowed for s in steps)


def _split_pattern(step: dict[str, Any]) -> str | None:
    if step.get("type") != "Split" or step.get("behavior") != "Isolated" or step.get("invert"):
        return None
    pat = step.get("pattern", {})
    return pat.get("Regex")


def rule_for_hf(spec: dict[str, Any]) -> CutRule:
    """The cut rule for a Hugging Face tokenizer, from its tokenizer.json pipeline (normaliser, pre-tokeniser)."""
    norm = _flat(spec.get("normalizer"), "normalizers")
    pre = _flat(spec.get("pre_tokenizer"), "pretokenizers") or []
    types = [s.get("type") for s in pre]
    if types == ["ByteLevel"] and pre[0].get("use_regex", True) and not pre[0].get("add_prefix_space"):
        if _norm_ok(norm, _NORM_BYTELEVEL):
            return _rule("before-blank-line", "ByteLevel pre-tokeniser (GPT-2 regex)")
    elif types and types[-1] == "ByteLevel" and all(t == "Split" for t in types[:-1]) and len(types) > 1:
        last = pre[-1]
        pats = [_split_pattern(s) for s in pre[:-1]]
        if (not last.get("use_regex", True) and not last.get("add_prefix_space")
                and all(p in AFTER_SAFE_SPLITS for p in pats) and _norm_ok(norm, _NORM_BYTELEVEL)):
            slash = "/" if O200K_PAT in pats else ""
            return _rule("after-blank-line", "Split regex + ByteLevel (cl100k / Llama 3 / Qwen 2 / DeepSeek "
                         "family)" + (", not before '/'" if slash else ""), exclude=slash)
    elif types and all(t in _WORD_PRE for t in types) and _norm_ok(norm, _NORM_WORDS):
        return _rule("before-blank-line", "whitespace-delimited pre-tokeniser (" + "+".join(map(str, types)) + ")")
    desc = "+".join(map(str, types)) or "none"
    return no_cuts(f"no cut rule proven for pre-tokeniser {desc} with this normaliser: the memo works on "
                   "whole segments between special tokens")


# -- tiktoken's own cuts: at special tokens -------------------------------------------------------------
class SpecialSplit:
    """Where tiktoken cuts a text whose special tokens are all allowed, so that text which spells special
    tokens (users paste "<|endoftext|>") is planned as ordinary slices and special-token units, exactly.

    tiktoken's `CoreBPE::encode` (src/lib.rs, 0.14) looks for the next special token with a regex that is
    the alternation of the escaped special strings, from where the last one ended; the text before it is
    split by the ordinary pattern on its own (the pattern never sees past the slice) and BPE-encoded, the
    special token's id follows, and the search goes on after it. So the encoding of the whole is the
    ordinary encoding of each slice, with the special ids between: the memo's own units.

    That holds piece by piece only when no two occurrences of special strings can overlap: then the
    leftmost search finds every occurrence, the rendered control tokens are exactly what it finds at the
    piece boundaries, and no match spans two pieces. Where one special string is a prefix of another,
    tiktoken takes the alternative its hash map lists first, which cannot be known from here. Every
    encoding tiktoken ships has `<|name|>` strings, which never overlap; a set that can is `overlapping`,
    and its prompts are tokenised directly (`TiktokenTokenizer`).
    """

    def __init__(self, specials: Iterable[str]) -> None:
        self.specials = sorted(set(specials), key=lambda s: (-len(s), s))
        self._rx = re.compile("|".join(map(re.escape, self.specials))) if self.specials else None
        self.overlapping = self._overlapping()

    def _overlapping(self) -> bool:
        """Whether an occurrence of one special string can begin inside one of another (or of itself,
        later than its start), or some special is empty (it would match everywhere)."""
        if "" in self.specials:
            return True
        rx = self._rx
        assert rx is not None  # not empty: a non-empty string
        starts = {s[:i] for s in self.specials for i in range(1, len(s))}  # proper prefixes
        # One ends inside another (contained, from position 1 on), or a tail of one begins another (the
        # whole of it, at the same start: one a prefix of the other).
        return any(rx.search(a, 1) is not None or any(a[d:] in starts for d in range(len(a)))
                   for a in self.specials)

    def spells(self, text: str) -> bool:
        """Whether `text` holds a special token's string (every slice `split` returns holds none)."""
        return self._rx is not None and self._rx.search(text) is not None

    def split(self, text: str) -> list[tuple[bool, str]] | None:
        """The text as tiktoken encodes it: non-empty ordinary slices (False) and special tokens (True), in
        order; None for an overlapping set (the caller tokenises the prompt directly)."""
        if self.overlapping or self._rx is None:
            return None
        out: list[tuple[bool, str]] = []
        at = 0
        for m in self._rx.finditer(text):
            if m.start() > at:
                out.append((False, text[at:m.start()]))
            out.append((True, m.group()))
            at = m.end()
        if at < len(text):
            out.append((False, text[at:]))
        return out
