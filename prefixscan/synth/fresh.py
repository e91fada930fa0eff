"""Fresh pseudo-English for `--text fresh`: every message is new text drawn word by word from a grammar.

The corpus mode (prefixscan.synth.text) slices one fixed corpus, so a paragraph can reappear in unrelated
messages and a tokenizer memo gets hits real traffic would not give. Here each sentence is a clause frame
(determiner, adjective, noun, verb, ...) filled from Zipf-weighted word tables (a few thousand words and
coined names, numbers, people's names), grouped into paragraphs, lists, headings, tables and code blocks.
Text repeats only where the workload shares content on purpose (a tenant's system prompt, a document).
The tables are built once from a fixed seed; the caller's random.Random decides every word, so the same
seed gives the same bytes.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from functools import lru_cache

from prefixscan.synth import lexicon as lx

CHARS_PER_TOKEN = 4  # the synth convention for sizing text (prefixscan.synth.text)
_SEED = 20261201
_TABLE = 16384  # slots per draw table: word i fills slots in proportion to its Zipf weight

# Clause frames: D determiner, A adjective, N/Ns noun, V/Vs/Ved/Ving verb forms, R adverb, P preposition,
# PR pronoun, M modal, C conjunction, # number, NM person name, X an identifier in backticks.
_FRAMES = [f.split() for f in (
    "D A N Vs D N P D N", "D N M V D Ns", "PR M V D A N P D N", "D N P D N Vs R", "Ns P D A N V Ns",
    "PR Ved D N P # Ns", "NM Ved D N P D N", "D N Vs A", "D N Vs # Ns P D N", "PR R V D Ns P D A N",
    "D A Ns P D N Ved P NM", "D N P X Vs D N", "Ving D N Vs D A N", "D N Vs A P Ving D Ns",
    "PR M R V D N P # Ns", "D # Ns P D N Ved R",
)]
_QUESTIONS = [f.split() for f in (
    "how do I V D N P D N", "can you V D A N P NM", "what is D N P D N", "why does D N V D Ns",
    "is there D N P Ving D Ns", "how M PR V D A N", "what happens when D N Vs D N", "where can I V D N",
    "which N Vs D A Ns", "could you V X P D N",
)]
_PROMPTS = [f.split() for f in (
    "please V D N P D N", "V D A N and V D Ns", "help me V D N P NM", "I need to V D # Ns P D N",
)]


def _zipf_table(words: list[str], s: float, size: int = _TABLE) -> list[str]:
    """Words laid out so that a uniform slot index draws word i with weight 1/(i+1)^s (every word kept)."""
    cum = list(itertools.accumulate(1.0 / (i + 1) ** s for i in range(len(words))))
    total = cum[-1]
    out: list[str] = []
    j = 0
    for slot in range(size):
        q = (slot + 0.5) / size * total
        while cum[j] < q:
            j += 1
        out.append(words[j])
    return list(dict.fromkeys(words).keys()) + out  # each word at least once, then by weight


class Fresh:
    """Draw tables for every word class, built once (see `fresh()`), and the text shapes built from them."""

    def __init__(self) -> None:
        coined = lx.coined_words(3000, _SEED)
        nouns = lx.NOUNS
        forms = [lx.verb_forms(v) for v in lx.VERBS]
        self.t: dict[str, list[str]] = {
            "N": _zipf_table(nouns, 0.9) + coined[:1500],
            "Ns": _zipf_table([lx.plural(n) for n in nouns], 0.9),
            "V": _zipf_table(lx.VERBS, 0.9), "Vs": _zipf_table([f[0] for f in forms], 0.9),
            "Ved": _zipf_table([f[1] for f in forms], 0.9), "Ving": _zipf_table([f[2] for f in forms], 0.9),
            "A": _zipf_table(lx.ADJECTIVES, 0.8), "R": lx.ADVERBS, "P": lx.PREPOSITIONS, "D": lx.DETERMINERS,
            "C": lx.CONJUNCTIONS, "PR": lx.PRONOUNS, "M": lx.AUXILIARIES,
        }
        self.coined = coined
        self.special: dict[str, Callable[[random.Random], str]] = {
            "#": number, "NM": self.name, "X": lambda r: f"`{self.ident(r)}`"}

    # -- words ----------------------------------------------------------------------------------------
    def word(self, rng: random.Random, code: str) -> str:
        t = self.t.get(code)
        if t is not None:
            return t[int(rng.random() * len(t))]
        if code in self.special:
            return self.special[code](rng)
        return code  # a literal word of a frame

    def name(self, rng: random.Random) -> str:
        return f"{rng.choice(lx.FIRST_NAMES)} {rng.choice(lx.LAST_NAMES)}"

    def ident(self, rng: random.Random) -> str:
        t = self.t
        v, n = t["V"][int(rng.random() * len(t["V"]))], t["N"][int(rng.random() * len(t["N"]))]
        return f"{v}_{n}" if rng.random() < 0.7 else f"{n.capitalize()}{v.capitalize()}"

    def words(self, rng: random.Random, k: int) -> str:
        """k fresh words (nouns, adjectives, verbs), for titles and short labels."""
        codes = ("N", "A", "N", "V", "Ns")
        return " ".join(self.word(rng, codes[int(rng.random() * 5)]) for _ in range(k))

    # -- sentences and paragraphs --------------------------------------------------------------------
    def clause(self, rng: random.Random, frames: list[list[str]] = _FRAMES) -> str:
        frame = frames[int(rng.random() * len(frames))]
        t, r = self.t, rng.random
        out = []
        for code in frame:
            tab = t.get(code)
            out.append(tab[int(r() * len(tab))] if tab is not None else self.word(rng, code))
        return " ".join(out)

    def sentence(self, rng: random.Random) -> str:
        text = self.clause(rng)
        u = rng.random()
        if u < 0.3:
            text += ", " + self.word(rng, "C") + " " + self.clause(rng)
        elif u < 0.4:
            text = self.word(rng, "R").capitalize() + ", " + text
        end = "." if rng.random() < 0.94 else ("?" if rng.random() < 0.5 else "!")
        return text[0].upper() + text[1:] + end

    def paragraph(self, rng: random.Random, sentences: int = 0) -> str:
        n = sentences or 2 + int(rng.random() * 5)
        return " ".join(self.sentence(rng) for _ in range(n))

    def prose(self, rng: random.Random, tokens: int) -> str:
        """About `tokens` tokens of plain paragraphs (system prompts, documents, tool descriptions)."""
        return _fill(rng, tokens, lambda: self.paragraph(rng))

    def document(self, rng: random.Random, tokens: int) -> str:
        """A structured document: headings, paragraphs, lists, now and then a table or a code block."""
        return _fill(rng, tokens, lambda: self._block(rng, (0.55, 0.7, 0.85, 0.93)))

    def answer(self, rng: random.Random, tokens: int) -> str:
        """An assistant answer in markdown of about `tokens` tokens, opening with a plain paragraph."""
        first = self.paragraph(rng, 1 + int(rng.random() * 3))
        if len(first) >= tokens * CHARS_PER_TOKEN:
            return first
        return first + "\n\n" + _fill(rng, tokens - len(first) // CHARS_PER_TOKEN,
                                      lambda: self._block(rng, (0.5, 0.7, 0.8, 0.85)))

    def _block(self, rng: random.Random, cuts: tuple[float, float, float, float]) -> str:
        u = rng.random()
        if u < cuts[0]:
            return self.paragraph(rng)
        if u < cuts[1]:
            bullet = "- " if rng.random() < 0.6 else None
            items = [self.sentence(rng) for _ in range(2 + int(rng.random() * 5))]
            return "\n".join((bullet or f"{i + 1}. ") + s for i, s in enumerate(items))
        if u < cuts[2]:
            return "## " + self.words(rng, 2 + int(rng.random() * 4)).title() + "\n\n" + self.paragraph(rng)
        if u < cuts[3]:
            return self.table(rng)
        return self.code(rng)

    def table(self, rng: random.Random) -> str:
        cols = [self.word(rng, "N").capitalize() for _ in range(2 + int(rng.random() * 3))]
        rows = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for _ in range(2 + int(rng.random() * 6)):
            rows.append("| " + " | ".join(self.word(rng, "N") if j == 0 else number(rng)
                                          for j in range(len(cols))) + " |")
        return "\n".join(rows)

    def code(self, rng: random.Random) -> str:
        """A short code block (python, sql, bash or json) with fresh identifiers and no blank line."""
        lang = ("python", "python", "sql", "bash", "json")[int(rng.random() * 5)]
        if lang == "json":
            return "```json\n" + self.json_object(rng, 3 + int(rng.random() * 6)) + "\n```"
        lines = _CODE[lang]
        head, body = lines[0], lines[1:]
        out = [self._code_line(rng, head)]
        out += [self._code_line(rng, body[int(rng.random() * len(body))]) for _ in range(2 + int(rng.random() * 9))]
        return f"```{lang}\n" + "\n".join(out) + "\n```"

    def _code_line(self, rng: random.Random, pattern: str) -> str:
        return pattern.format(i=self.ident(rng), j=self.ident(rng), n=self.word(rng, "N"),
                              m=self.word(rng, "N"), k=int(rng.random() * 1000))

    def json_object(self, rng: random.Random, keys: int) -> str:
        """A flat JSON object with fresh keys and values (tool results, code blocks)."""
        import orjson

        obj: dict[str, object] = {}
        for _ in range(keys):
            key = self.ident(rng).lower()
            u = rng.random()
            obj[key] = (int(rng.random() * 100_000) if u < 0.3 else self.name(rng) if u < 0.4
                        else rng.random() < 0.5 if u < 0.5 else self.clause(rng))
        return orjson.dumps(obj).decode()

    # -- user turns ----------------------------------------------------------------------------------
    def question(self, rng: random.Random) -> str:
        """A user turn: short with a heavy tail (log-normal words), now and then with pasted material."""
        frames = _QUESTIONS if rng.random() < 0.7 else _PROMPTS
        text = self.clause(rng, frames)
        text = text[0].upper() + text[1:] + ("?" if frames is _QUESTIONS else ".")
        extra = int(rng.lognormvariate(2.3, 1.1))  # median ~10 more words, mean ~18, long tail
        while extra > 0:
            s = self.sentence(rng)
            text += " " + s
            extra -= s.count(" ") + 1
        u = rng.random()
        if u < 0.03:
            text += "\n\n" + self.code(rng)
        elif u < 0.06:
            text += "\n\n" + self.document(rng, int(rng.lognormvariate(6.2, 0.7)))  # a pasted excerpt
        return text

    def tool_result(self, rng: random.Random, tokens: int) -> str:
        """A tool's JSON result of about `tokens` tokens: a status and a list of fresh records."""
        items = []
        size = 40
        while size < tokens * CHARS_PER_TOKEN:
            item = self.json_object(rng, 2 + int(rng.random() * 5))
            items.append(item)
            size += len(item) + 1
        return '{"status": "ok", "count": ' + str(len(items)) + ', "items": [' + ",".join(items) + "]}"


def number(rng: random.Random) -> str:
    """A number in one of the shapes prose carries: counts, decimals, percents, money, years, dates, versions."""
    u = rng.random()
    if u < 0.3:
        return str(int(rng.random() * 1000))
    if u < 0.45:
        return f"{rng.random() * 100:.1f}"
    if u < 0.55:
        return f"{int(rng.random() * 100)}%"
    if u < 0.65:
        return f"${rng.random() * 10_000:,.2f}"
    if u < 0.75:
        return str(2015 + int(rng.random() * 12))
    if u < 0.85:
        return f"2026-{1 + int(rng.random() * 12):02d}-{1 + int(rng.random() * 28):02d}"
    if u < 0.93:
        return f"v{int(rng.random() * 5)}.{int(rng.random() * 20)}.{int(rng.random() * 10)}"
    return f"#{int(rng.random() * 100_000)}"


_CODE = {
    "python": ["def {i}({n}, {m}={k}):", "    {n} = {j}({m})", "    if {n} > {k}:", "        return {j}({n}, {m})",
               "    for {n} in {m}_list:", "        {n}.{i}({k})", "    {m}[\"{n}\"] = {k}",
               "    raise ValueError(\"{n} {m}\")", "    return {n}",
               "    # {i}: {n} before {m}", "    {n}_total += {j}({m}) * {k}"],
    "sql": ["SELECT {n}_id, count(*) AS {m}_count", "FROM {i}", "JOIN {j} USING ({n}_id)", "WHERE {m} > {k}",
            "  AND {n}_status = '{m}'", "GROUP BY {n}_id", "ORDER BY {m}_count DESC", "LIMIT {k};"],
    "bash": ["set -euo pipefail", "export {n}_dir=/srv/{m}/{k}", "{i} --{n} {k} --{m}", "mkdir -p \"${n}_dir\"",
             "cp {j}.conf /etc/{n}/", "curl -s localhost:{k}/{n} | jq .{m}", "echo \"{n} {m} done\""],
}


def _fill(rng: random.Random, tokens: int, block: Callable[[], str]) -> str:
    """Blocks separated by blank lines until about `tokens` tokens (at least one block)."""
    target = max(1, tokens) * CHARS_PER_TOKEN
    out = [block()]
    size = len(out[0])
    while size < target:
        b = block()
        out.append(b)
        size += len(b) + 2
    return "\n\n".join(out)


@lru_cache(maxsize=1)
def fresh() -> Fresh:
    """The shared tables, built on first use."""
    return Fresh()
