"""The regex library of dynamic values and the label words that name them, in several languages.

Applications print a request's time, ids and the user's identity in many surface forms; a detector that
only knows ISO-8601 and English labels misses most of them. Values are classified by shape first (an
email is an email whatever its label), then by label words (a number labelled "Request #" is a counter).
Everything here works on one short line: callers only run it on lines already known to vary.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from prefixscan.redact import EMAIL_RE, UUID_RE  # one definition, shared with redaction

_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*\.?"
_DOW = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)[a-z]*\.?,?"
_TIME = r"\d{1,2}:\d{2}(?::\d{2}(?:[.,]\d{1,9})?)?(?:\s?[AaPp]\.?[Mm]\.?)?"
_ZONE = r"(?:\s?(?:Z|UTC|GMT|[+-]\d{2}:?\d{2}|[A-Z]{2,4}T))?"

TIMESTAMP_RES: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    # ISO-8601 / SQL: 2026-11-29T10:15:00Z, 2026-11-29 10:15, with ms or offsets
    r"\b\d{4}-\d{2}-\d{2}[T ]" + _TIME + _ZONE,
    # RFC 2822: Sun, 29 Nov 2026 10:15:00 +0000
    r"\b(?:" + _DOW + r"\s+)?\d{1,2}\s+" + _MON + r"\s+\d{4}\s+" + _TIME + _ZONE,
    # November 29, 2026 10:15:00 UTC / Nov 29 2026 10:15
    r"\b" + _MON + r"\s+\d{1,2},?\s+\d{4},?\s+(?:at\s+)?" + _TIME + _ZONE,
    # 11/29/2026 10:15, 29.11.2026 10:15:00
    r"\b\d{1,2}[/.]\d{1,2}[/.]\d{2,4},?\s+" + _TIME + _ZONE,
    # bare clock time with seconds: 10:15:00
    r"(?<![\d:])\d{1,2}:\d{2}:\d{2}(?:[.,]\d{1,6})?(?![\d:])",
))
DATE_RES: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    r"\b\d{4}-\d{2}-\d{2}\b",
    r"\b\d{1,2}/\d{1,2}/\d{4}\b",
    r"\b\d{1,2}\.\d{1,2}\.\d{4}\b",
    r"\b(?:" + _DOW + r"\s+)?\d{1,2}\s+" + _MON + r"\s+\d{4}\b",
    r"\b" + _MON + r"\s+\d{1,2},?\s+\d{4}\b",
    r"\d{4}年\d{1,2}月\d{1,2}日",
))
# Dates and times written in words, in English, German, French and Spanish ("Monday, 20 November 2026,
# 09:00", "Montag, 20. November 2026 um 09:00 Uhr", "le lundi 20 novembre 2026 à 9h00", "lunes, 20 de
# noviembre de 2026, 09:00"). Names are matched case-insensitively; a year or a clock time is required, so a
# month name in prose ("in May we...") is not a date.
_MONTHS_W = ("january|february|march|april|may|june|july|august|september|october|november|december"
             "|januar|jänner|februar|märz|maerz|mai|juni|juli|oktober|dezember"
             "|janvier|février|fevrier|mars|avril|juin|juillet|août|aout|septembre|octobre|novembre|décembre"
             "|decembre|enero|febrero|marzo|abril|mayo|junio|julio|agosto|septiembre|setiembre|octubre"
             "|noviembre|diciembre"
             "|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|mär|okt|dez|janv|févr|avr|juil|déc|ene|abr|ago"
             "|dic")
_DAYS_W = ("monday|tuesday|wednesday|thursday|friday|saturday|sunday|montag|dienstag|mittwoch|donnerstag"
           "|freitag|samstag|sonnabend|sonntag|lundi|mardi|mercredi|jeudi|vendredi|samedi|dimanche|lunes|martes"
           "|miércoles|miercoles|jueves|viernes|sábado|sabado|domingo|mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun")
_MON_W = r"(?:" + _MONTHS_W + r")\.?"
_DOW_W = r"(?:(?:" + _DAYS_W + r")\.?,?\s+(?:(?:le|den|der|el)\s+)?)"
_TIME_W = (r"(?:,?\s*(?:at|um|à|a\s+las|a\s+la|las)?\s*\d{1,2}(?:[:.]\d{2}|\s?h\s?\d{2}|h)(?::\d{2})?"
           r"(?:\s?(?:uhr|[ap]\.?m\.?))?(?:\s?(?:utc|gmt|[+-]\d{2}:?\d{2}|[a-z]{2,4}t))?)")
_DMY_W = r"\b" + _DOW_W + r"?\d{1,2}(?:\.|er|º|°)?\s+(?:de\s+)?" + _MON_W + r"(?:\s+(?:de\s+)?|,\s*)\d{4}"
_MDY_W = r"\b" + _DOW_W + r"?" + _MON_W + r"\s+\d{1,2}(?:st|nd|rd|th)?,?\s+\d{4}"
_DM_W = r"\b" + _DOW_W + r"\d{1,2}(?:\.|er)?\s+(?:de\s+)?" + _MON_W  # weekday, no year: "Montag, 20. November"
WORD_TIMESTAMP_RES: tuple[re.Pattern[str], ...] = tuple(re.compile(p, re.IGNORECASE) for p in (
    r"(?:" + _DMY_W + r"|" + _MDY_W + r"|" + _DM_W + r")" + _TIME_W + r"(?![\w:])",
))
WORD_DATE_RES: tuple[re.Pattern[str], ...] = tuple(re.compile(p + r"(?!\w)", re.IGNORECASE)
                                                   for p in (_DMY_W, _MDY_W, _DM_W))


# Dates and times in any form, timestamps first (a date with a clock time is a timestamp).
DATE_SPAN_RES: tuple[tuple[str, tuple[re.Pattern[str], ...]], ...] = (
    ("timestamp", TIMESTAMP_RES + WORD_TIMESTAMP_RES), ("date", DATE_RES + WORD_DATE_RES))

EPOCH_RE = re.compile(r"^(?:1[5-9]\d{8}|1[5-9]\d{11})(?:\.\d+)?$")  # 2017..2033 in s or ms
HEX_RE = re.compile(r"^(?:0x)?(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{12,}$")
ULID_RE = re.compile(r"^[0-9A-HJKMNP-TV-Z]{26}$")
PREFIXED_ID_RE = re.compile(r"^[A-Za-z]{2,8}[-_](?=[A-Za-z0-9]*\d)[A-Za-z0-9]{6,}$")
B64_RE = re.compile(r"^(?=[A-Za-z0-9+/_-]*\d)(?=[A-Za-z0-9+/_-]*[A-Za-z])[A-Za-z0-9+/_-]{16,}={0,2}$")
PHONE_RE = re.compile(r"^(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?)?\d{2,4}(?:[\s.-]?\d{2,4}){1,4}$")
INT_RE = re.compile(r"^#?\d{1,12}$")
NAME_RE = re.compile(r"^(?:[A-Z][a-z'’-]+,? ?){1,3}$|^[a-z]+\.[a-z]+$")

# Label words per kind, lower case, matched as substrings of the normalised label. Order matters: the
# first kind whose words match wins (a "Session ID" is a session id, not a request id).
LABEL_WORDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("email", ("email", "e-mail", "mail", "correo", "courriel", "почта", "メール", "邮箱")),
    ("phone", ("phone", "callback", "mobile", " tel ", "telefon", "teléfono", "téléphone", "телефон", "電話", "电话")),
    ("session_id", ("session", "conversation id", "thread id", "sesión", "sitzung", "сесси", "セッション", "会话")),
    ("counter", ("request #", "sequence", "call number", "counter", "número de", "aufruf nr", "номер", "turn #",
                 "attempt", "seq", "n°", "nº")),
    ("random_token", ("nonce", "cache-buster", "cache buster", "signature", "firma", "jeton", "token", "salt",
                      "одноразов", "ノンス", "random")),
    ("timestamp", ("time", "timestamp", " now ", "hora", "heure", "zeit", "время", "時刻", "时间", "uhrzeit")),
    ("date", ("date", "fecha", "datum", "дата", "日付", "日期", "today")),
    ("request_id", ("request id", "request-id", "requestid", "trace", "correlation", "span", " id", "id ", "-id",
                    "identifier", "identifiant", "solicitud", "anfrage", "запроса", "リクエスト", "请求", "uuid",
                    " ref", "ticket", " order", "account")),
    ("user_name", ("user", "name", "customer", "client", "talking to", "speaking with", "usuario", "nombre",
                   "utilisateur", "nom ", "benutzer", "kunde", "пользовател", "имя", "ユーザー", "用户", "姓名")),
)

_LABEL_LINE = re.compile(
    r"^\s*[\[{(]?\s*[\"']?(?P<label>[^:=\"\n\[\]{}]{1,48}?)[\"']?\s*(?P<sep>[:=：]|\s[-–]\s|\s\|\s)\s*[\"']?"
    r"(?P<value>.*?)[\"']?\s*[\]})]?[,.;]?\s*$")
_HEADING = re.compile(r"^\s*(?:#{1,6}\s+|\*\*)?(?P<label>[^\n*]{1,48}?)(?:\*\*)?\s*:?\s*$")


@dataclass(frozen=True, slots=True)
class LabelledValue:
    """A line split into label and value; `value_start` is the value's offset inside the line."""

    label: str
    value: str
    value_start: int


def split_label(line: str) -> LabelledValue:
    """Split `Label: value`, `[Label: value]`, `Label=value`, `{"Label": "value"}`; no label -> label ''."""
    m = _LABEL_LINE.match(line)
    if m and m.group("value") and _wordy(m.group("label")):
        label = m.group("label").strip()
        # Guard against prose: a label is short and has at most five words.
        if len(label.split()) <= 5 and len(m.group("value")) <= 160:
            return LabelledValue(label, m.group("value"), m.start("value"))
    stripped = line.strip()
    return LabelledValue("", stripped, line.find(stripped) if stripped else 0)


def _wordy(label: str) -> bool:
    """A label has letters and is not mostly digits (`2026-11-29T10` in `2026-11-29T10:15` is not one)."""
    letters = sum(c.isalpha() for c in label)
    return letters > sum(c.isdigit() for c in label)


def heading_label(line: str) -> str | None:
    """The label of a heading line (`### Request time`, `**Date**`, `User:`) that precedes its value."""
    s = line.strip()
    if not s or len(s) > 52 or not (s.startswith(("#", "**")) or s.endswith((":", "："))):
        return None
    m = _HEADING.match(s)
    return m.group("label").strip() if m else None


def label_kind(label: str) -> str | None:
    """The kind a label's words name, in any of the supported languages; None when it names none."""
    s = " " + label.lower().strip() + " "
    for kind, words in LABEL_WORDS:
        if any(w in s for w in words):
            return kind
    return None


def value_kind(value: str) -> str | None:
    """The kind a value's shape proves on its own (an email, a timestamp, a UUID, ...); None when unsure."""
    v = value.strip().strip("\"'<>[]()")
    if not v:
        return None
    if EMAIL_RE.search(v):
        return "email"
    (_, timestamps), (_, dates) = DATE_SPAN_RES
    if any(p.search(v) for p in timestamps) or EPOCH_RE.match(v):
        return "timestamp"
    if any(p.search(v) for p in dates):
        return "date"
    if UUID_RE.search(v):
        return "uuid"
    if ULID_RE.match(v) or HEX_RE.match(v) or PREFIXED_ID_RE.match(v):
        return "id"
    if B64_RE.match(v):
        return "base64"
    if INT_RE.match(v):
        return "integer"
    digits = sum(c.isdigit() for c in v)
    if PHONE_RE.match(v) and digits >= 9 and any(c in v for c in "+( -."):
        return "phone"
    return None


def classify(label: str, value: str, numbers_increase: bool = False) -> str | None:
    """Combine shape and label into one field kind (timestamp, date, request_id, session_id, user_name, email,
    phone, counter, random_token), or None for an unnamed varying span."""
    shape = value_kind(value)
    by_label = label_kind(label) if label else None
    if shape in ("email", "phone"):
        return shape
    if shape in ("timestamp", "date"):
        if by_label == "counter" and EPOCH_RE.match(value.strip()) is None:
            return "counter"
        return shape
    if by_label == "session_id":
        return "session_id"
    if shape == "integer":
        if by_label in ("counter", "request_id", "random_token", "phone"):
            return by_label
        return "counter" if numbers_increase else "random_token"
    if shape in ("uuid", "id", "base64"):
        if by_label in ("random_token", "request_id"):
            return by_label
        return "request_id" if shape in ("uuid", "id") else "random_token"
    if by_label in ("email", "phone"):
        return by_label
    if by_label == "user_name" and (NAME_RE.match(value.strip()) or len(value.split()) <= 4):
        return "user_name"
    return None
