"""The tokenizer interface and the segment memo shared by the backends."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, cast

import numpy as np
import xxhash

from prefixscan.encode import core as encode_core
from prefixscan.encode.hashing import BytesLRU
from prefixscan.encode.tokenize.cuts import CutRule, SpecialSplit
from prefixscan.read.content import content_text
from prefixscan.read.record import Record, RecordError

EMPTY = np.zeros(0, dtype=np.uint32)
Ids = list[int] | np.ndarray  # a text's token ids as a backend returns them (tiktoken: uint32 arrays)
# Chat requests also tokenised directly at the start of a run. Not what makes the memo exact (its cuts are
# proven per tokenizer, `cuts.py`); a cheap alarm: a difference means a defect here, and the run goes on
# with direct tokenisation and says so.
SELF_CHECK_FIRST = 8
# Bound of the whole-piece cache (paragraph cuts and keys of text pieces seen before). A dynamic system
# prompt is a new piece on every request, so without a bound it grew with the request count. Only speed
# depends on it: a piece that fell out is split and hashed again (tests run with a tiny bound).
PIECE_CACHE_BYTES = 16 << 20
# Bound of the token memo (token ids per distinct text unit), least recently used out first. Turns of a
# conversation resend its earlier messages, so what is worth keeping is the recent units; only speed
# depends on this bound (a unit that fell out is tokenised again; tests run with a tiny bound). It was
# 64M tokens (~300 MiB with the per-entry overhead), cleared all at once when full.
MEMO_BYTES = 64 << 20
MEMO_ENTRY = 320  # bytes a memo entry costs besides its token ids (array header, key, LRU links; measured)
KEY = 16  # bytes of a memo key (xxh3-128)
# Bound of the conversation cache (each conversation's last prompt: its pieces' digests, keys and token ids). A turn
# resends its conversation's history, so what it shares with the previous turn is taken from there instead
# of planned and assembled again; only speed depends on this bound (tests run with a tiny bound).
LAST_BYTES = 32 << 20
LAST_UNIT = 64  # bytes per unit a remembered prompt costs besides its token ids and digests (key, length)


@dataclass
class TokenizerStats:
    """What the summary reports about tokenisation."""

    segments_seen: int = 0
    segments_tokenised: int = 0
    tokens_tokenised: int = 0
    memo_evictions: int = 0
    units_resumed: int = 0  # text units taken from the conversation's previous prompt, not planned again
    memo_rule: str | None = None  # where the memo cuts text, and for which pre-tokeniser that was proven
    fallback_reason: str | None = None


class SegmentMemo:
    """Token ids per distinct text unit, keyed by xxh3-128 of the text, bounded in bytes (LRU)."""

    def __init__(self, max_bytes: int | None = None) -> None:
        self._memo = BytesLRU(MEMO_BYTES if max_bytes is None else max_bytes)

    @property
    def evictions(self) -> int:
        return self._memo.evicted

    def __len__(self) -> int:
        return len(self._memo)

    @staticmethod
    def key(text: str) -> bytes:
        return xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass"))

    def get(self, key: bytes) -> np.ndarray | None:
        return self._memo.get(key)

    def __contains__(self, key: bytes) -> bool:
        """Held, without counting as a use (planning checks; assembly then uses)."""
        return key in self._memo._d

    def put(self, key: bytes, ids: np.ndarray) -> None:
        self._memo.put(key, ids, ids.nbytes + MEMO_ENTRY)


@dataclass
class Encoded:
    """Token ids of one record, and the tokens of its system-and-tools head when it has one.

    Chat records also carry their pieces (content key and token count per segment or special token) and
    the piece indexes after which the hash chain is worth remembering (`hashing.ChainCache`).
    """

    tokens: np.ndarray
    head_tokens: int | None
    piece_keys: list[bytes] | None = None
    piece_lens: list[int] | None = None
    checkpoints: list[int] | None = None


@dataclass
class Tokenizer:
    """Base class: `id` goes into the namespace; `approximate_template` is reported in the summary."""

    id: str
    template_version: str
    approximate_template: bool
    stats: TokenizerStats = field(default_factory=TokenizerStats)

    def encode_batch(self, records: list[Record]) -> Sequence[Encoded | RecordError]:
        raise NotImplementedError

    def encode_direct(self, record: Record) -> np.ndarray:
        """Reference path: render and tokenise the whole prompt at once (tests compare against it)."""
        raise NotImplementedError

    def _completion_ids(self, prompt: str) -> np.ndarray:
        """A completion's prompt tokenised as plain text (no chat template)."""
        raise NotImplementedError

    def _encode_plain(self, r: Record) -> np.ndarray:
        """A record that is not a chat: a completion's prompt, or the log's own token ids."""
        if r.kind == "completion":
            return self._completion_ids(r.prompt or "")
        if r.kind == "tokens":
            return token_array(r.token_ids if r.token_ids is not None else [])
        raise RecordError("wrong_kind", f"cannot tokenise a {r.kind} record")


def token_array(ids: list[int] | np.ndarray) -> np.ndarray:
    """Validated uint32 array from a log's token ids."""
    arr = np.asarray(ids, dtype=np.int64)
    if arr.size and (arr.min() < 0 or arr.max() >= 2**32):
        raise RecordError("wrong_type", "token ids must be integers in [0, 2^32)")
    return arr.astype(np.uint32)


def _replay(text: str, starts: bytes, blob: bytes, units: list[tuple[bool, str] | None], keys: list[bytes]) -> int:
    """Append a remembered piece's paragraphs (cut from `text` again) and their keys; return how many."""
    cuts = memoryview(starts).cast("I").tolist()
    cuts.append(len(text))
    units.extend((False, text[a:b]) for a, b in pairwise(cuts))
    keys.extend(blob[i:i + KEY] for i in range(0, len(blob), KEY))
    return len(cuts) - 1


def conversation_key(r: Record) -> str:
    """What a record's conversation is known by: its conversation id (with its tenant), else the start of
    its first two messages, else of its prompt. The encode pool pins a conversation to one process by it
    (`pipeline.encoder.pin_hash`) and the conversation cache finds a turn's previous prompt by it; only
    speed depends on it (what is taken from the previous prompt is checked piece by piece, `plan`)."""
    if r.conversation_id is not None:
        return f"c\0{r.tenant}\0{r.conversation_id}"
    if r.messages:
        return "m\0" + "\0".join(content_text(m.get("content"))[:512] for m in r.messages[:2])
    return "p\0" + (r.prompt or "")[:1024]


@dataclass(slots=True)
class Last:
    """A conversation's last assembled prompt: its pieces' digests (`SegmentEncoder._piece_digests`, 16 bytes
    each; not their text, so a bounded cache holds more conversations) and, per piece, where its units end."""

    digests: bytes
    keys: list[bytes]
    piece_end: list[int]
    text_end: list[int]  # text units up to the end of each piece
    char_end: list[int]  # characters up to the end of each piece (what the cache counts)
    tokens: np.ndarray
    lens: list[int]  # tokens per unit


@dataclass
class Planned:
    """One prompt's units (special token or text paragraph) with memo keys, ready to assemble.

    The first `base_units` units are the leading pieces it shares with its conversation's previous prompt
    (`base`); their token ids are taken from there, so `units` holds None in their place.
    """

    units: list[tuple[bool, str] | None]
    keys: list[bytes]
    piece_end: list[int]  # for each input piece, the index after its last unit
    poisoned: bool = False  # text spells special tokens that cannot be split exactly: tokenise it directly
    text_end: list[int] = field(default_factory=list)
    char_end: list[int] = field(default_factory=list)
    base: Last | None = None
    base_units: int = 0
    pieces: list[tuple[bool, str]] | None = None
    conv: Hashable | None = None
    digests: bytes = b""  # of the leading pieces compared with `base`'s (`_resume`)


class SegmentEncoder:
    """Tokenise prompts given as pieces, each distinct text unit once, new units in one batched call."""

    def __init__(self, encode_many: Callable[[list[str]], Sequence[Ids]], special_ids: dict[str, int],
                 stats: TokenizerStats, rule: CutRule,
                 special_split: SpecialSplit | None = None,
                 piece_bytes: int | None = None,
                 encode_first: Callable[[list[str]], Sequence[Ids]] | None = None) -> None:
        self.encode_many = encode_many
        # A tokenizer that treats text at the very start of the prompt differently (Metaspace with
        # prepend_scheme "first"): `encode_many` then tokenises as the prompt's later segments are, and
        # a first text piece is tokenised whole by `encode_first`, memoised under its own key.
        self.encode_first = encode_first
        self.pending_first: dict[bytes, str] = {}
        # A backend whose tokeniser reads special-token strings inside text as special tokens (tiktoken with
        # every special allowed): such text is planned as its slices and special tokens (`_plan_spelled`).
        self.split = special_split
        self.spells_special = special_split.spells if special_split is not None else None
        self.poison: set[bytes] = set()  # keys of texts (pieces and parts) known to spell a special token
        self.special = {t: np.array([i], dtype=np.uint32) for t, i in special_ids.items()}
        self.memo = SegmentMemo()
        self.stats = stats
        self.rule = rule
        stats.memo_rule = f"{rule.name} ({rule.why})"
        self.pending: dict[bytes, str] = {}
        # Whole text pieces seen before (a conversation's earlier messages come back every turn): where
        # their paragraphs start (uint32) and their keys (joined); paragraphs the memo no longer holds are
        # tokenised again. Offsets, not the paragraph strings: the text comes with the piece again, and
        # holding it here cost ~10 KB per request.
        self.pieces = BytesLRU(PIECE_CACHE_BYTES if piece_bytes is None else piece_bytes)
        self.last = BytesLRU(LAST_BYTES)  # conversation key -> Last (`plan`'s conv)
        self.special_keys: dict[str, bytes] = {}

    def _special_key(self, text: str) -> bytes:
        """A special token's key: 16 bytes like every text unit's (the chain cache joins keys), never equal
        to the key of text that spells it; computed once (`special_keys`, which the compiled core reads)."""
        k = self.special_keys.get(text)
        if k is None:
            k = self.special_keys[text] = xxhash.xxh3_128_digest(b"\x00special\x00" + text.encode("utf-8"))
        return k

    def plan(self, pieces: list[tuple[bool, str]], conv: Hashable | None = None) -> Planned:
        """Units and memo keys of one prompt; text not seen before is queued for `run_pending`.

        With `conv`, the leading pieces equal to those of the conversation's last assembled prompt are
        taken from it (exact: a piece's token ids depend only on its text and, for the first, on being
        first), so a turn plans and assembles only what it adds to its history."""
        p = Planned([], [], [], pieces=pieces, conv=conv)
        start = self._resume(p, pieces) if conv is not None else 0
        texts, chars = (p.text_end[-1], p.char_end[-1]) if start else (0, 0)
        fast = encode_core.core()
        if fast is not None:  # the same loop compiled; pieces the rule may cut still go to _plan_text
            rule = self.rule
            seen, poisoned = fast.plan_pieces(
                p, pieces, start, texts, chars, self.special_keys, self._special_key,
                self._plan_first if self.encode_first is not None else None, self._plan_text,
                2 * rule.min_unit if rule.split is not None else -1, self.memo._memo._d, self.pending,
                self.poison, self.spells_special, xxhash.xxh3_128_digest, self.pieces._d)
            self.stats.segments_seen += seen
            p.poisoned = p.poisoned or poisoned
            return p
        for j in range(start, len(pieces)):
            special, text = pieces[j]
            before = len(p.units)
            if special:
                p.units.append((True, text))
                p.keys.append(self._special_key(text))
            elif j == 0 and self.encode_first is not None:
                self._plan_first(text, p)
            else:
                before += self._plan_text(text, p)  # its special-token units are not text units
            p.piece_end.append(len(p.units))
            texts += 0 if special else len(p.units) - before
            chars += len(text)
            p.text_end.append(texts)
            p.char_end.append(chars)
        return p

    def _resume(self, p: Planned, pieces: list[tuple[bool, str]]) -> int:
        """Take the leading pieces `pieces` shares with the conversation's last prompt; return how many."""
        last = self.last.get(p.conv)
        if last is None:
            return 0
        i, p.digests = self._piece_digests(pieces, last.digests)
        if i == 0:
            return 0
        u = last.piece_end[i - 1]
        p.base, p.base_units = last, u
        p.units = [None] * u
        p.keys = last.keys[:u]
        p.piece_end = last.piece_end[:i]
        p.text_end = last.text_end[:i]
        p.char_end = last.char_end[:i]
        self.stats.segments_seen += p.text_end[-1]
        self.stats.units_resumed += p.text_end[-1]
        return i

    def _piece_digests(self, pieces: list[tuple[bool, str]], old: bytes | None) -> tuple[int, bytes]:
        """16-byte digests of `pieces` in order, with `old` only while they equal old's (then how many
        leading pieces are the same). A special piece's is its special key, a text piece's xxh3-128 of its
        text with seed 1 (so no text's digest is built like a special key)."""
        fast = encode_core.core()
        if fast is not None:  # the same loop compiled
            return cast("tuple[int, bytes]", fast.piece_digests(
                pieces, old, self.special_keys, self._special_key, xxhash.xxh3_128_digest))
        n = len(pieces) if old is None else min(len(pieces), len(old) // KEY)
        out = []
        for i, (special, text) in enumerate(pieces[:n]):
            d = (self._special_key(text) if special
                 else xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass"), 1))
            out.append(d)
            if old is not None and d != old[KEY * i:KEY * (i + 1)]:
                return i, b"".join(out[:i])
        return n, b"".join(out)

    def _remember_last(self, p: Planned, toks: np.ndarray, lens: list[int]) -> None:
        """Keep an assembled prompt as its conversation's last (digests of the pieces `_resume` did not
        compare added)."""
        assert p.pieces is not None and p.conv is not None  # plan() always records them
        k = len(p.digests) // KEY
        digests = p.digests + self._piece_digests(p.pieces[k:], None)[1] if k < len(p.pieces) else p.digests
        size = toks.nbytes + len(digests) + LAST_UNIT * len(lens)
        self.last.put(p.conv, Last(digests, p.keys, p.piece_end, p.text_end, p.char_end, toks, lens), size)

    def _plan_first(self, text: str, p: Planned) -> None:
        k = xxhash.xxh3_128_digest(b"\x00first\x00" + text.encode("utf-8", "surrogatepass"))
        p.units.append((False, text))
        p.keys.append(k)
        self.stats.segments_seen += 1
        # No backend has both a first-piece encoder and a special split (Hugging Face splits its rendered
        # text at its added tokens before planning): were there one, the plan would be marked poisoned.
        if self.spells_special is not None and self.spells_special(text):
            p.poisoned = True
        elif k not in self.memo:
            self.pending_first[k] = text

    def _plan_text(self, text: str, p: Planned) -> int:
        """Plan a text piece: cut by the rule, through the piece cache, new units queued. Returns how many of
        the units it added are special tokens: text that spells them is planned as tiktoken cuts it."""
        units, keys = p.units, p.keys
        rule = self.rule  # texts the rule would not cut skip the piece cache
        multi = rule.split is not None and len(text) >= 2 * rule.min_unit and text.count("\n") >= 2
        if multi:
            pk = self.memo.key(text)
            known = self.pieces.get(pk)
            if known is not None:
                n = _replay(text, known[0], known[1], units, keys)
                self.stats.segments_seen += n
                # Its parts were checked when first seen (clean); any the memo has since let go are
                # tokenised again with this batch's new text.
                for j in range(len(units) - n, len(units)):
                    k = keys[j]
                    if k not in self.memo and k not in self.pending:
                        self.pending[k] = units[j][1]  # type: ignore[index]  # just replayed: not None
                return 0
            # Checked whole, before the rule cuts it: a special token's string is then never cut apart.
            if pk in self.poison or (self.spells_special is not None and self.spells_special(text)):
                self.poison.add(pk)
                return self._plan_spelled(text, p)
        else:  # one unit (`_core.c` plan_single, compiled)
            k = self.memo.key(text)
            if k in self.poison:
                return self._plan_spelled(text, p)
            if k not in self.memo and k not in self.pending:
                # Only new text is checked (what the memo holds was clean when it came).
                if self.spells_special is not None and self.spells_special(text):
                    self.poison.add(k)
                    return self._plan_spelled(text, p)
                self.pending[k] = text
            units.append((False, text))
            keys.append(k)
            self.stats.segments_seen += 1
            return 0
        parts = self.rule.parts(text)
        start = len(units)
        for part in parts:
            k = self.memo.key(part)
            units.append((False, part))
            keys.append(k)
            if k not in self.memo and k not in self.pending:
                self.pending[k] = part
        self.stats.segments_seen += len(parts)
        self._remember(pk, parts, keys[start:])
        return 0

    def _plan_spelled(self, text: str, p: Planned) -> int:
        """A text that spells special tokens, as tiktoken encodes it (`cuts.SpecialSplit`): its slices
        planned as any text, the special tokens as units between them; the count of those. Exact by
        construction, so those requests share the memo (and later turns resume) like any other."""
        split = self.split.split(text) if self.split is not None else None
        if split is None:  # special strings that overlap: the request is tokenised directly
            p.poisoned = True
            p.units.append((False, text))
            p.keys.append(self.memo.key(text))
            self.stats.segments_seen += 1
            return 0
        n = 0
        for special, part in split:
            if special:
                p.units.append((True, part))
                p.keys.append(self._special_key(part))
                n += 1
            else:
                self._plan_text(part, p)  # spells none (the split leaves no match): no special units
        return n

    def _remember(self, pk: bytes, parts: list[str], keys: list[bytes]) -> None:
        starts = np.cumsum([0, *map(len, parts[:-1])], dtype=np.uint32).tobytes()
        blob = b"".join(keys)
        self.pieces.put(pk, (starts, blob), len(starts) + len(blob) + 200)

    def run_pending(self) -> None:
        for pending, encode in ((self.pending, self.encode_many), (self.pending_first, self.encode_first)):
            if not pending or encode is None:
                continue
            ks = list(pending)
            for k, ids in zip(ks, encode([pending[k] for k in ks]), strict=True):
                self.memo.put(k, np.asarray(ids, dtype=np.uint32))
                self.stats.segments_tokenised += 1
                self.stats.tokens_tokenised += len(ids)
            pending.clear()
        self.stats.memo_evictions = self.memo.evictions

    def assemble(self, p: Planned) -> tuple[np.ndarray, list[int]]:
        """Token ids of the whole prompt and the token count of each unit (remembered as the conversation's
        last prompt when planned with one)."""
        u = p.base_units
        fast = encode_core.core()
        if fast is not None:
            return self._assemble_compiled(fast, p)
        arrs = []
        for (special, text), k in zip(cast("list[tuple[bool, str]]", p.units[u:]), p.keys[u:], strict=True):
            if special:
                arrs.append(self.special[text])
                continue
            arr = self.memo.get(k)
            if arr is None:  # evicted between planning and assembly
                encode = self.encode_first if self.encode_first is not None and not arrs and not u else self.encode_many
                arr = np.asarray(encode([text])[0], dtype=np.uint32)
            arrs.append(arr)
        lens = [len(a) for a in arrs]
        if u:
            assert p.base is not None  # base_units > 0 only with a base
            lens = p.base.lens[:u] + lens
            arrs.insert(0, p.base.tokens[:sum(lens[:u])])
        toks = np.concatenate(arrs) if arrs else np.zeros(0, dtype=np.uint32)
        if p.conv is not None:
            self._remember_last(p, toks, lens)
        return toks, lens

    def _assemble_compiled(self, fast: Any, p: Planned) -> tuple[np.ndarray, list[int]]:
        """`assemble` with its loop and the concatenation compiled (`encode_core`); the same result."""
        u = p.base_units

        def miss(j: int, done: int) -> np.ndarray:  # evicted between planning and assembly
            text = p.units[j][1]  # type: ignore[index]
            encode = self.encode_first if self.encode_first is not None and not done and not u else self.encode_many
            return np.asarray(encode([text])[0], dtype=np.uint32)

        base = p.base
        assert base is not None or not u  # base_units > 0 only with a base
        blob, lens = fast.assemble(p.units, p.keys, u, self.memo._memo._d, self.special, miss,
                                   base.tokens if base is not None and u else None,
                                   base.lens if base is not None and u else None)
        toks = np.frombuffer(blob, dtype=np.uint32) if blob else np.zeros(0, dtype=np.uint32)
        if p.conv is not None:
            self._remember_last(p, toks, lens)
        return toks, lens


def assemble_batch(seg: SegmentEncoder, records: list[Record], plans: list[Any],
                   encode_one: Callable[[Record, Any], Encoded | RecordError]) -> list[Encoded | RecordError]:
    """The last step of a backend's `encode_batch`, once every record is planned: tokenise the new units in
    one call, then encode each record from its plan, a record's RecordError standing in its place."""
    seg.run_pending()
    out: list[Encoded | RecordError] = []
    for r, plan in zip(records, plans, strict=True):
        try:
            out.append(encode_one(r, plan))
        except RecordError as exc:
            out.append(exc)
    return out
