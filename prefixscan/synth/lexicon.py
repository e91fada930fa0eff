"""The word lists behind `--text fresh`: words by part of speech, most frequent first, and the rules that
expand them (plurals, verb forms, coined product and project names).

Only the lists live here; `prefixscan.synth.fresh` turns them into Zipf-weighted draw tables once, from a
fixed seed, so the vocabulary never changes between runs.
"""

from __future__ import annotations

import random

NOUNS = """
time system request answer question document policy customer account service support user team data
model result report order product payment problem issue change process step example case record file
value version number price plan contract server message error note detail section rule reason option
method function feature project task event limit period date amount item list table page line field
query response cache prefix token prompt context window memory cluster node replica queue worker batch
job pipeline stage input output summary source reference chunk passage index vector score rank evidence
fact claim risk impact severity priority status owner manager engineer analyst operator client vendor
partner region endpoint gateway proxy route header body payload schema format template release update
review approval budget forecast quarter revenue expense margin cost invoice refund credit balance tax
discount tier subscription renewal notice clause term condition party obligation liability warranty
termination disclosure consent privacy security access control audit log incident alert failure retry
timeout latency throughput capacity bandwidth storage disk volume snapshot backup restore migration
deployment container image registry secret key certificate domain network subnet firewall rule port
protocol packet connection session cookie browser device phone laptop screen keyboard camera battery
patient diagnosis treatment medication dosage allergy visit provider insurance coverage benefit
deductible premium referral appointment schedule employee salary bonus holiday training handbook
guideline procedure compliance regulation standard requirement specification design architecture
component module parameter argument library framework package dependency interface class object
property attribute variable constant loop branch commit merge conflict test fixture mock assertion
benchmark profile trace metric dashboard threshold baseline target goal milestone roadmap sprint
backlog ticket escalation resolution feedback rating survey campaign audience channel brand market
competitor strategy growth share revenue supplier shipment carrier warehouse inventory stock
delivery address city country street building floor office desk meeting agenda minute decision
proposal draft revision comment paragraph sentence word letter chapter article story author editor
reader student teacher course lesson exam grade school university library museum garden river
mountain forest ocean island weather temperature season morning evening night week month year
century history culture language music movie game sport player coach match season ticket
recipe ingredient kitchen oven flavor meal breakfast lunch dinner coffee tea water bottle glass
""".split()

VERBS = """
use make take give find check send need want show tell ask keep start run move call provide include
describe explain summarize answer confirm verify validate compare calculate estimate return cite quote
mention list extract identify classify translate rewrite format respond follow ensure avoid apply
update create delete read write receive process handle manage monitor track review approve reject
merge split sort filter group join load store save cache fetch parse render encode decode compress
measure report schedule cancel renew refund charge ship deliver install configure deploy restart
scale replicate migrate restore back test debug fix patch release publish archive export import
share open close lock unlock grant revoke rotate sign encrypt hash route balance retry drop accept
plan design build draft edit improve reduce increase prevent detect resolve escalate assign notify
remind discuss agree decide prefer recommend suggest consider expect assume require allow support
contain cover affect change replace remove add attach upload download print scan copy paste
""".split()

IRREGULAR = {
    "make": ("makes", "made", "making"), "take": ("takes", "took", "taking"), "give": ("gives", "gave", "giving"),
    "find": ("finds", "found", "finding"), "send": ("sends", "sent", "sending"), "keep": ("keeps", "kept", "keeping"),
    "tell": ("tells", "told", "telling"), "show": ("shows", "showed", "showing"),
    "run": ("runs", "ran", "running"), "read": ("reads", "read", "reading"),
    "write": ("writes", "wrote", "writing"), "build": ("builds", "built", "building"),
    "split": ("splits", "split", "splitting"), "drop": ("drops", "dropped", "dropping"),
    "ship": ("ships", "shipped", "shipping"), "plan": ("plans", "planned", "planning"),
    "begin": ("begins", "began", "beginning"), "get": ("gets", "got", "getting"), "put": ("puts", "put", "putting"),
}

ADJECTIVES = """
new good first last long great small large high low next early late important different same able
recent current previous following available required optional standard custom internal external
public private primary secondary final initial monthly weekly daily hourly regional global local remote
secure stable dynamic static shared unique common specific general complete accurate clear simple
quick slow fast safe ready busy free full empty open closed active pending resolved critical minor
major urgent routine manual automatic detailed brief short exact rough correct wrong valid invalid
expensive cheap reliable flexible strict careful modern legacy upstream downstream mobile digital
physical annual strong weak heavy light warm cold bright dark quiet loud old young happy helpful
""".split()

ADVERBS = """
also only just still already often usually always never sometimes again soon later today now then
carefully clearly exactly briefly quickly directly typically generally probably certainly simply
really fully nearly almost mostly rarely recently currently previously finally initially
""".split()

PREPOSITIONS = ("of in to for with on at by from about into over after before under between through during "
                "without within across against").split()
DETERMINERS = "the the the a a this that each every some any our your their its another".split()
CONJUNCTIONS = "and and but or so because while although if when since unless".split()
PRONOUNS = "we you they it I he she".split()
AUXILIARIES = "can should will must may might could would".split()

FIRST_NAMES = """
Alice Bob Carol David Emma Farid Grace Hiroshi Ines Jamal Katya Liam Maria Nikhil Olga Pedro Quinn Rosa
Sven Tomas Uma Victor Wen Xavier Yara Zoltan Amara Bruno Chen Dmitri Elif Fatima Goran Hana Ivan Julia
Kenji Lucia Mateo Nadia Omar Priya Rahul Sofia Tariq Ursula Valentina William Ximena Yusuf Zara Aiden
Beatriz Cyrus Dalia Emeka Freya Gideon Helga Ibrahim Jonas Kaveh Leila Marek Noor Oskar Paloma Rania
""".split()

LAST_NAMES = """
Smith Garcia Nguyen Muller Rossi Kowalski Tanaka Silva Ivanova Okafor Patel Johansson Dubois Novak Cohen
Haddad Kim Lopez Schmidt Andersen Moreau Yilmaz Kaur Mendes Petrov Fischer Costa Sato Brown Martin
Adeyemi Bergstrom Castillo Dimitrov Eriksen Ferreira Gallagher Horvath Ibarra Jensen Kovacs Lindqvist
""".split()

_ONSETS = "b c d f g h j k l m n p r s t v w z br cr dr fl gr kl pr st tr vr sk sp".split()
_VOWELS = "a e i o u a e o ai ea io".split()
_CODAS = ["", "", "n", "r", "s", "x", "l", "m", "nt", "rk", "st"]


def coined_words(n: int, seed: int) -> list[str]:
    """`n` distinct pronounceable coined words (product, project and service names), from a fixed seed."""
    rng = random.Random(seed)
    out: dict[str, None] = {}
    while len(out) < n:
        syllables = rng.choice((2, 2, 3, 3, 4))
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)) + rng.choice(_CODAS)
        out.setdefault(word, None)
    return list(out)


_UNCOUNTABLE = {"data", "feedback", "evidence", "compliance", "privacy", "security", "access", "inventory",
                "stock", "weather", "history", "music", "coffee", "tea", "water", "revenue", "growth"}


def plural(noun: str) -> str:
    """English plural by the usual spelling rules (good enough for coined text)."""
    if noun in _UNCOUNTABLE:
        return noun
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2:-1] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def verb_forms(verb: str) -> tuple[str, str, str]:
    """(third person, past, -ing) of a verb."""
    if verb in IRREGULAR:
        return IRREGULAR[verb]
    if verb.endswith("e"):
        return verb + "s", verb + "d", verb[:-1] + "ing"
    if verb.endswith("y") and verb[-2:-1] not in "aeiou":
        return verb[:-1] + "ies", verb[:-1] + "ied", verb + "ing"
    if verb.endswith(("s", "x", "ch", "sh")):
        return verb + "es", verb + "ed", verb + "ing"
    return verb + "s", verb + "ed", verb + "ing"
