"""What the detector knows about one request *content* (a tenant and its early messages and tools),
memoised: later turns of a conversation resend the same early messages, and a tenant's requests share
its system prompt, so almost everything the detector derives per request is found here by one look-up.

A `Content` holds the request's pieces (pieces.py), its order checks (tool order, RAG order: pure
functions of the tools and the first user message), the serialized lists of its early messages
(list_order.py), whether its text needs the whole-message
normalisers, the family vote (valid while `FamilyIndex.version` is unchanged: owners are only added) and
the alignment with one family's exemplar (a pure function of the two). Every memo here is bounded by
bytes and holds only values a recomputation would give again, so only speed depends on the bounds.
"""

from __future__ import annotations

from bisect import bisect_left
from functools import lru_cache
from typing import Any

import orjson
import xxhash

from prefixscan.detect import normalisation as nz
from prefixscan.detect.list_order import find_lists, order_signature, signature
from prefixscan.detect.pattern_free import Alignment, Family
from prefixscan.detect.pieces import Piece, PieceMemo, text_key
from prefixscan.detect.rewrite import _tool_hash
from prefixscan.encode.hashing import BytesLRU
from prefixscan.read.record import Record

ROLE_SEED = {"system": 1, "developer": 1, "user": 2, "tools": 3}
CONTENT_BYTES = 16 << 20  # bound of the memo of request contents
CHECK_BYTES = 8 << 20  # bound of the memo of RAG-order checks by document head
LIST_BYTES = 8 << 20  # bound of the memo of an early message's serialized lists by its piece key


@lru_cache(maxsize=4096)
def tenant_salt(tenant: str) -> int:
    return nz.text_hash("tenant:" + tenant)


class Content:
    """One request content (see module docstring); shared by every request that sends it."""

    __slots__ = ("key", "live", "checks", "lists", "cr", "nonnfc", "version", "fam", "wants_new", "fid", "al")

    def __init__(self, key: tuple, pieces: list[Piece], checks: list[tuple], lists: list[tuple] | None = None) -> None:
        self.key = key  # (tenant salt, the piece keys in request order: tools before the first user message)
        # The keys of the pieces with units: the pieces themselves stay in the piece memo only, so a
        # content never keeps evicted units alive (and memory stays within the two bounds).
        self.live = [p.key for p in pieces if p.norm]
        self.checks = checks  # (kind, message index, item hashes, item starts, multiset hash, sequence hash)
        self.lists = lists or []  # (message index, list_order.TextList, multiset hash, sequence hash)
        self.cr = self.nonnfc = False
        for p in pieces:
            self.cr |= p.cr  # `nz.needs("line_endings", ...)` of some early message
            self.nonnfc |= p.nonnfc  # `nz.needs("unicode", ...)` of some early message
        self.version = -1  # FamilyIndex.version `fam` and `wants_new` were voted at
        self.fam: Family | None = None
        self.wants_new = False
        self.fid = -1  # the family `al` aligns with
        self.al: Alignment | None = None

    def size(self) -> int:
        """Bytes charged to the memo (its pieces are charged to the piece memo)."""
        al = self.al
        n = 100 * max(4, len(al.pairs) + len(al.runs) + len(al.drifts)) if al is not None else 400
        return (600 + 60 * len(self.key) + sum(200 + 24 * len(c[2]) for c in self.checks)
                + sum(300 + 80 * len(c[1].hashes) for c in self.lists) + n)


class ContentMemo:
    """Request contents by (tenant salt, piece keys); pieces by text (`PieceMemo`)."""

    def __init__(self, memo_bytes: int) -> None:
        self.pieces = PieceMemo(memo_bytes)
        self.lru = BytesLRU(CONTENT_BYTES)
        self._heads = BytesLRU(CHECK_BYTES)
        self._lists = BytesLRU(LIST_BYTES)

    def of(self, rec: Record, salt: int) -> tuple[dict[int, str], Content]:
        """The texts of a record's early messages (`nz.early_messages`, inlined: this runs per request)
        by message index, and its Content."""
        msgs = rec.messages or []
        texts: dict[int, str] = {}
        keys: list[tuple] = []
        tkey = ("t", xxhash.xxh3_128_intdigest(orjson.dumps(rec.tools))) if rec.tools else None
        tools_done = tkey is None
        for mi, m in enumerate(msgs[:6]):
            role = m.get("role")
            if role not in ("system", "developer", "user"):
                break
            c = m.get("content")
            texts[mi] = t = c if type(c) is str else nz.message_text(m)
            if not tools_done and role == "user":
                keys.append(tkey)  # type: ignore[arg-type]
                tools_done = True
            keys.append(("u", mi, ROLE_SEED[role], text_key(t)))
            if role == "user":
                break
        if not tools_done:
            keys.append(tkey)  # type: ignore[arg-type]
        key = (salt, *keys)
        hit = self.lru.get(key)
        if hit is None:
            hit = self._content(key, keys, rec, msgs, texts, salt)
            self.lru.put(key, hit, hit.size())
        return texts, hit

    def adopt(self, content: Content, pieces: list[Piece]) -> None:
        """Take a content and its pieces that another process computed (an encode worker, which derives
        them beside the encoding: `pipeline/encode_workers.py`). Both are pure functions of the request's
        early messages, so they equal what `of` would compute here; what this memo holds already is kept
        (its pieces carry this process's family votes)."""
        for p in pieces:
            if self.pieces.lru.get(p.key) is None:
                self.pieces.lru.put(p.key, p, p.size())
        if self.lru.get(content.key) is None:
            self.lru.put(content.key, content, content.size())

    def pieces_of(self, content: Content, rec: Record, texts: dict[int, str], live: bool = True) -> list[Piece]:
        """A content's pieces with units (all its pieces with `live=False`), from the piece memo."""
        return self._pieces(content.live if live else content.key[1:], rec, texts)

    def _pieces(self, keys: list[tuple] | tuple, rec: Record, texts: dict[int, str]) -> list[Piece]:
        return [self.pieces.tools(rec.tools or [], ROLE_SEED["tools"], k) if k[0] == "t"
                else self.pieces.message(k[1], k[2], texts[k[1]], k) for k in keys]

    def aligned(self, content: Content) -> None:
        """Charge a content again once it holds an alignment."""
        self.lru.put(content.key, content, content.size())

    def _content(self, key: tuple, keys: list[tuple], rec: Record, msgs: list[dict[str, Any]],
                 texts: dict[int, str], salt: int) -> Content:
        pieces = self._pieces(keys, rec, texts)
        checks = []
        if rec.tools and len(rec.tools) >= 2:
            hs = tuple(_tool_hash(t) for t in rec.tools)
            checks.append(("tool_order", -1, hs, [None] * len(rec.tools), *order_signature(hs, salt ^ 6)))
        if keys and keys[-1][0] == "u" and msgs[keys[-1][1]].get("role") == "user":
            got = self._rag(texts[keys[-1][1]], keys[-1][1], salt)
            if got:
                checks.append(got)
        lists = [item for k in keys if k[0] == "u" for item in self._lists_of(k, texts[k[1]], salt)]
        return Content(key, pieces, checks, lists)

    def _lists_of(self, k: tuple, text: str, salt: int) -> tuple[tuple, ...]:
        """(message index, TextList, multiset hash, sequence hash) of each serialized list of an early message
        (`find_lists`, `signature`), memoised by its piece key (which names its text and role) and tenant:
        a tenant's system prompt comes back in every new conversation's content."""
        hit = self._lists.get((salt, k))
        if hit is None:
            hit = tuple((k[1], tl, *signature(tl, k[1], salt))
                        for tl in find_lists(text, chunks=k[2] == ROLE_SEED["system"]))
            self._lists.put((salt, k), hit, 200 + sum(300 + 150 * len(tl.hashes) for _, tl, _, _ in hit))
        return hit

    def _rag(self, text: str, mi: int, salt: int) -> tuple:
        """The RAG-order check of a first user message, memoised by its head as well (documents recur
        with new questions)."""
        head = _rag_head(text)
        if head is None:
            return ()
        k = ("h", mi, salt, text_key(head))
        hit = self._heads.get(k)
        if hit is None:
            got = _paragraph_hashes(head, text)
            hit = () if got is None else ("rag_order", mi, got[0], got[1], *order_signature(got[0], salt ^ (mi + 7)))
            self._heads.put(k, hit, 300 + 100 * (len(hit[2]) if hit else 0))
        return hit


def _paragraph_hashes(head: str, text: str) -> tuple[tuple[int, ...], list[int]] | None:
    """Hashes and starts of the paragraphs of `head` (`_rag_head` of `text`), when there are enough. Its
    lines are the leading lines of `text`, which the text's units read too."""
    tab = nz.leading_lines(text)[0]
    paras = nz.line_paragraphs(tab, bisect_left(tab.starts, len(head)))  # `nz.paragraphs(head)`, by lines
    if len(paras) >= 3 and tab.starts[paras[-1][1]] >= 256:
        return tuple(nz.line_paragraph_hashes(tab, paras)), [tab.starts[a] for a, _ in paras]
    return None


def _rag_head(text: str) -> str | None:
    """The part of a first user message the RAG-order check reads: its paragraphs but the last (the
    question), when there are at least three; None otherwise."""
    text = text[: nz.MAX_CHARS]
    cut = text.rfind("\n\n")  # the last paragraph (the question) is not part of the signature
    return text[:cut + 2] if cut > 0 and text.count("\n\n", 0, cut) >= 2 else None
