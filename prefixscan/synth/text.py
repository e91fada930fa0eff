"""Fast deterministic pseudo-text.

Realistic prompt sizes (thousands of tokens) must be cheap to produce millions of times, so all prose is
a slice of one fixed corpus built once from a word list: a slice is a string copy, not per-word work.
The corpus is built from a fixed seed (not the user's seed), so it never changes between runs; the user's
seed only chooses where slices start. Slices start at sentence starts, so two different texts diverge at
their first words and never share a prefix by accident.
"""

from __future__ import annotations

import bisect
import random
from functools import lru_cache

CHARS_PER_TOKEN = 4  # the usual English estimate; used both to size text and to count tokens

WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which but have an they
you were her she there been one all we their has would when if so no will more out up into do any your what
some can them other time than only its may these could our over most such also after new first two very well
where should through because each just those people how too many any must still before between under never
system model request answer question document policy contract customer account service support agent tool
result search query data record report invoice payment order product shipping delivery return refund credit
balance statement period date amount total tax price discount plan tier subscription renewal cancel notice
clause section article paragraph term condition party obligation liability warranty indemnity termination
confidential information disclosure consent privacy security access control audit log event incident alert
error failure retry timeout latency throughput capacity memory cache prefix token context window prompt
template field value schema format version release update change review approval owner team manager
engineer analyst operator user client vendor partner region cluster replica server node queue worker batch
job task step workflow pipeline stage input output summary detail note comment reference source citation
chunk passage retrieval index embedding vector score rank relevant evidence fact claim statement finding
risk issue problem cause effect impact severity priority status pending active closed open resolved
department office branch store warehouse inventory stock supplier shipment carrier tracking address city
country state postal code phone email message call ticket case escalation resolution feedback rating
quality standard requirement specification design architecture component module function method parameter
argument response header body payload endpoint route gateway proxy balancer routing policy rule exception
medical patient record diagnosis treatment medication dosage allergy history visit provider insurance claim
coverage benefit deductible premium network approval authorization referral appointment schedule
financial revenue expense budget forecast quarter annual growth margin cost saving investment asset
employee salary bonus leave holiday training onboarding handbook guideline procedure compliance regulation
always carefully clearly exactly briefly politely accurately quickly completely directly usually typically
important relevant specific general complete accurate current previous following available required
optional standard custom internal external public private primary secondary final initial monthly weekly
daily hourly regional global local remote secure stable dynamic static shared unique common specific
provide include describe explain summarize answer check confirm verify validate compare calculate estimate
return cite quote mention list extract identify classify translate rewrite format respond refuse ask follow
ensure avoid use apply update create delete read write send receive process handle manage monitor track
""".split()

FIRST_NAMES = """
Alice Bob Carol David Emma Farid Grace Hiroshi Ines Jamal Katya Liam Maria Nikhil Olga Pedro Quinn Rosa
Sven Tomas Uma Victor Wen Xavier Yara Zoltan Amara Bruno Chen Dmitri Elif Fatima Goran Hana Ivan Julia
Kenji Lucia Mateo Nadia Omar Priya Rahul Sofia Tariq Ursula Valentina William Ximena Yusuf Zara
""".split()

LAST_NAMES = """
Smith Garcia Nguyen Muller Rossi Kowalski Tanaka Silva Ivanova Okafor Patel Johansson Dubois Novak Cohen
Haddad Kim Lopez Schmidt Andersen Moreau Yilmaz Kaur Mendes Petrov Fischer Costa Sato Brown Martin
""".split()

TENANT_NAMES = """
acme globex initech umbrella hooli stark wayne wonka cyberdyne soylent tyrell vandelay gringotts oscorp
aperture blackmesa dunder massive wernham pied
""".split()

_CORPUS_SEED = 20261129
_CORPUS_WORDS = 400_000


class Corpus:
    """One immutable string of prose plus the offsets where its sentences start."""

    def __init__(self, n_words: int = _CORPUS_WORDS) -> None:
        rng = random.Random(_CORPUS_SEED)
        words = WORDS
        pieces: list[str] = []
        starts: list[int] = []
        pos = 0
        written = 0
        sentence_in_para = 0
        while written < n_words:
            n = rng.randint(7, 22)
            sent = rng.choices(words, k=n)
            text = sent[0].capitalize() + " " + " ".join(sent[1:]) + "."
            starts.append(pos)
            sentence_in_para += 1
            sep = "\n\n" if sentence_in_para >= rng.randint(3, 7) else " "
            if sep == "\n\n":
                sentence_in_para = 0
            pieces.append(text + sep)
            pos += len(text) + len(sep)
            written += n
        self.text = "".join(pieces)
        self.starts = starts

    def prose(self, rng: random.Random, tokens: int) -> str:
        """About `tokens` tokens of prose starting at a random sentence; ends at a sentence end."""
        n_chars = max(1, tokens) * CHARS_PER_TOKEN
        limit = len(self.text) - n_chars - 1
        if limit <= 0:
            raise ValueError(f"asked for {tokens} tokens of prose, more than the corpus holds")
        hi = bisect.bisect_right(self.starts, limit)
        start = self.starts[int(rng.random() * hi)]  # random() is much cheaper than randrange()
        end = self.text.find(". ", start + n_chars)
        if end < 0 or end - start > n_chars + 400:
            end = self.text.find(" ", start + n_chars)
        return self.text[start : end + 1].rstrip()

    def max_tokens(self) -> int:
        """The largest prose slice this corpus can serve."""
        return len(self.text) // (2 * CHARS_PER_TOKEN)


@lru_cache(maxsize=1)
def corpus() -> Corpus:
    """The shared corpus, built on first use (about a tenth of a second)."""
    return Corpus()


def estimate_tokens(text: str) -> int:
    """Approximate token count of a text (ceil of chars / 4); used for Mooncake lengths."""
    return -(-len(text) // CHARS_PER_TOKEN)


_STREAM_RNG = random.Random(_CORPUS_SEED + 1)
_STREAM = [w for w in _STREAM_RNG.choices(WORDS, k=65_536)]


def words(rng: random.Random, k: int) -> str:
    """k pseudo-random words joined by spaces, for short varied strings like questions and titles.

    A slice of a fixed random word stream at a random start: one draw instead of k.
    """
    i = int(rng.random() * (len(_STREAM) - k))
    return " ".join(_STREAM[i : i + k])


_QUESTIONS = ("What does it say about the {0} {1}?", "Can you summarize the {0} and {1} for {2}?",
              "Is there anything about {0} {1} {2}? Quote the relevant part.",
              "How should I handle the {0} when the {1} is {2}?", "List every {0} related to {1}.")


def question(rng: random.Random) -> str:
    """A short user question in one of a few phrasings, with a variable-length unique tail."""
    w = words(rng, 3 + int(rng.random() * 26)).split(" ", 3)
    return _QUESTIONS[int(rng.random() * len(_QUESTIONS))].format(*w) + (" " + w[3] if len(w) > 3 else "")


@lru_cache(maxsize=65536)
def person_name(index: int) -> tuple[str, str]:
    """A stable (first, last) name for a user index: the same user always has the same name."""
    r = random.Random(f"name-{index}")
    return r.choice(FIRST_NAMES), r.choice(LAST_NAMES)


def tenant_name(index: int) -> str:
    """Stable tenant names: well-known fictional companies first, then tenant-NN."""
    return TENANT_NAMES[index] if index < len(TENANT_NAMES) else f"tenant-{index:02d}"
