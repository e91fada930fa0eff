"""Registry of cache-breaking dynamic fields.

Applications often write a timestamp, a request id or the user's name near the top of a prompt; every
token after it then differs between requests and the prefix cache misses. Detectors need many kinds and
surface forms to be tested against, so each kind is a registry entry: a name, labels (several languages),
value generators in several surface forms, and how stable its value is (per request, conversation, user,
day), which decides whether two requests can still share the line. New kinds are one `register()` call.
"""

from __future__ import annotations

import base64
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache

from prefixscan.synth.text import person_name

STABILITIES = ("request", "conversation", "user", "day")


@dataclass(frozen=True)
class Context:
    """What a value generator may depend on. `rng` is the run's sequential generator."""

    time: float
    seq: int
    user_index: int
    tenant: str
    conversation_id: str | None
    counter: int
    rng: random.Random


@dataclass(frozen=True)
class BreakerKind:
    """One kind of dynamic field: its labels, its surface forms, and how often its value changes."""

    name: str
    labels: tuple[str, ...]
    forms: Mapping[str, Callable[[Context], str]]
    stability: str
    description: str
    styles: tuple[str, ...] = ()  # line styles this kind uses; () = every LINE_STYLES entry


@dataclass(frozen=True)
class BreakerSpec:
    """How one prompt source injects one kind: fixed label, form, line style and position."""

    kind: str
    label: str
    form: str
    style: str
    position: str


REGISTRY: dict[str, BreakerKind] = {}

LINE_STYLES: dict[str, str] = {
    "colon": "{label}: {value}\n",
    "bracket": "[{label}: {value}]\n",
    "equals": "{label}={value}\n",
    "json": '{{"{label}": "{value}"}}\n',
    "heading": "### {label}\n{value}\n\n",
}
# In text, not a field: unlabelled sentences (only kinds that list them in `styles` use them).
SENTENCE_STYLES: dict[str, str] = {
    "sentence": "Today is {value}, and you answer for this team only from the material below.\n",
}
CLASSIC_STYLES = ("colon", "bracket", "equals", "json", "heading")

# top: first thing in the system message (breaks everything); after_intro: after the first paragraph of
# the system prompt (breaks most of it); user_tail: end of the last user message (harmless).
POSITIONS: dict[str, float] = {"top": 0.6, "after_intro": 0.25, "user_tail": 0.15}


def register(kind: BreakerKind) -> BreakerKind:
    """Add a kind to the registry (later registrations with the same name replace earlier ones)."""
    if kind.stability not in STABILITIES:
        raise ValueError(f"unknown stability {kind.stability!r} for breaker {kind.name!r}")
    REGISTRY[kind.name] = kind
    return kind


def render(spec: BreakerSpec, ctx: Context) -> tuple[str, str, int]:
    """Render one injected line; returns (line, value, offset of value inside line)."""
    value = REGISTRY[spec.kind].forms[spec.form](ctx)
    template = LINE_STYLES.get(spec.style) or SENTENCE_STYLES[spec.style]
    before = template.split("{value}", 1)[0].format(label=spec.label)
    line = template.format(label=spec.label, value=value)
    return line, value, len(before)


def choose_spec(rng: random.Random, kinds: tuple[str, ...]) -> BreakerSpec:
    """Pick a kind among `kinds` and fix its label, form, style and position for one prompt source."""
    kind = REGISTRY[rng.choice(kinds)]
    positions = list(POSITIONS)
    return BreakerSpec(
        kind=kind.name,
        label=rng.choice(kind.labels),
        form=rng.choice(sorted(kind.forms)),
        style=rng.choice(list(kind.styles or CLASSIC_STYLES)),
        position=rng.choices(positions, weights=[POSITIONS[p] for p in positions])[0],
    )


# ---------------------------------------------------------------- value helpers

_MONTHS = ("January February March April May June July August September October November December").split()
_DAYS = "Mon Tue Wed Thu Fri Sat Sun".split()
_B62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def _gm(t: float) -> time.struct_time:
    return time.gmtime(int(t))


def _ms(t: float) -> int:
    return int(round(t * 1000)) % 1000


def _uuid(bits: int) -> str:
    h = f"{bits:032x}"
    h = h[:12] + "4" + h[13:16] + "89ab"[int(h[16], 16) & 3] + h[17:]
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _base(n: int, alphabet: str, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, len(alphabet))
        out.append(alphabet[r])
    return "".join(out)


@lru_cache(maxsize=65536)
def _user_digits(tenant: str, user_index: int) -> int:
    return random.Random(f"phone-{tenant}-{user_index}").randrange(10**9, 10**10)


def _handle(ctx: Context) -> str:
    first, last = person_name(ctx.user_index)
    return f"{first.lower()}.{last.lower()}"


def _conv_bits(ctx: Context) -> int:
    key = ctx.conversation_id or f"req-{ctx.seq}"
    return random.Random(f"session-{ctx.tenant}-{key}").getrandbits(128)


# ---------------------------------------------------------------- the kinds

register(BreakerKind(
    name="timestamp",
    labels=("Current time", "Timestamp", "Request time", "Now", "Fecha y hora", "Heure actuelle",
            "Aktuelle Zeit", "Текущее время", "現在時刻", "当前时间"),
    forms={
        "iso_z": lambda c: time.strftime("%Y-%m-%dT%H:%M:%SZ", _gm(c.time)),
        "iso_ms": lambda c: time.strftime("%Y-%m-%dT%H:%M:%S", _gm(c.time)) + f".{_ms(c.time):03d}Z",
        "iso_offset": lambda c: time.strftime("%Y-%m-%dT%H:%M:%S+00:00", _gm(c.time)),
        "sql": lambda c: time.strftime("%Y-%m-%d %H:%M:%S", _gm(c.time)),
        "rfc2822": lambda c: (lambda g: f"{_DAYS[g.tm_wday]}, {g.tm_mday:02d} {_MONTHS[g.tm_mon - 1][:3]} "
                              f"{g.tm_year} {g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d} +0000")(_gm(c.time)),
        "human": lambda c: (lambda g: f"{_MONTHS[g.tm_mon - 1]} {g.tm_mday}, {g.tm_year} "
                            f"{g.tm_hour:02d}:{g.tm_min:02d}:{g.tm_sec:02d} UTC")(_gm(c.time)),
        "epoch_s": lambda c: str(int(c.time)),
        "epoch_ms": lambda c: str(int(round(c.time * 1000))),
    },
    stability="request",
    description="the request's wall-clock time, to the second or millisecond",
))

register(BreakerKind(
    name="date",
    labels=("Today's date", "Date", "Fecha", "Date du jour", "Datum", "Дата", "日付"),
    forms={
        "iso": lambda c: time.strftime("%Y-%m-%d", _gm(c.time)),
        "us": lambda c: time.strftime("%m/%d/%Y", _gm(c.time)),
        "eu": lambda c: time.strftime("%d.%m.%Y", _gm(c.time)),
        "long": lambda c: (lambda g: f"{_MONTHS[g.tm_mon - 1]} {g.tm_mday}, {g.tm_year}")(_gm(c.time)),
    },
    stability="day",
    description="today's date: changes once a day, so it splits the cache by day only",
))

register(BreakerKind(
    name="request_id",
    labels=("Request ID", "Trace-Id", "X-Request-Id", "Correlation ID", "ID de solicitud",
            "Identifiant de requête", "Anfrage-ID", "ID запроса", "リクエストID"),
    forms={
        "uuid4": lambda c: _uuid(c.rng.getrandbits(128)),
        "hex32": lambda c: f"{c.rng.getrandbits(128):032x}",
        "hex16": lambda c: f"{c.rng.getrandbits(64):016x}",
        "prefixed": lambda c: "req_" + _base(c.rng.getrandbits(128), _B62, 22),
        "ulid": lambda c: _base((int(c.time * 1000) << 80) | c.rng.getrandbits(80), _CROCKFORD, 26)[::-1],
        "numeric": lambda c: str(c.rng.randrange(10**11, 10**12)),
    },
    stability="request",
    description="a fresh identifier per request",
))

register(BreakerKind(
    name="user_name",
    labels=("User", "Customer name", "You are talking to", "Name", "Nombre del usuario",
            "Nom de l'utilisateur", "Benutzer", "Пользователь", "ユーザー名"),
    forms={
        "full": lambda c: " ".join(person_name(c.user_index)),
        "last_first": lambda c: (lambda f, la: f"{la}, {f}")(*person_name(c.user_index)),  # type: ignore[arg-type]  # mypy misreads the inner lambda
        "first": lambda c: person_name(c.user_index)[0],
        "handle": _handle,
    },
    stability="user",
    description="the end user's name: stable per user, so only that user's requests can share it",
))

register(BreakerKind(
    name="email",
    labels=("Email", "User email", "Contact", "Correo electrónico", "Courriel", "E-Mail", "Почта"),
    forms={
        "plain": lambda c: f"{_handle(c)}@{c.tenant}.example.com",
        "named": lambda c: f"{' '.join(person_name(c.user_index))} <{_handle(c)}@{c.tenant}.example.com>",
    },
    stability="user",
    description="the end user's email address",
))

register(BreakerKind(
    name="phone",
    labels=("Phone", "Callback number", "Teléfono", "Téléphone", "Telefon", "Телефон"),
    forms={
        "e164": lambda c: f"+1{_user_digits(c.tenant, c.user_index)}",
        "us": lambda c: (lambda d: f"({d[:3]}) {d[3:6]}-{d[6:]}")(str(_user_digits(c.tenant, c.user_index))),
        "intl": lambda c: (lambda d: f"+44 {d[:2]} {d[2:6]} {d[6:]}")(str(_user_digits(c.tenant, c.user_index))),
    },
    stability="user",
    description="the end user's phone number",
))

register(BreakerKind(
    name="session_id",
    labels=("Session", "Session ID", "Conversation ID", "ID de sesión", "Sitzungs-ID", "ID сессии"),
    forms={
        "uuid4": lambda c: _uuid(_conv_bits(c)),
        "hex": lambda c: f"{_conv_bits(c) >> 64:016x}",
        "prefixed": lambda c: "sess_" + _base(_conv_bits(c), _B62, 16),
    },
    stability="conversation",
    description="a per-conversation id: stable within a conversation, unique across them",
))

register(BreakerKind(
    name="counter",
    labels=("Request #", "Sequence", "Call number", "Número de llamada", "Aufruf Nr.", "Номер запроса"),
    forms={
        "plain": lambda c: str(c.counter),
        "padded": lambda c: f"{c.counter:08d}",
        "hash": lambda c: f"#{c.counter}",
    },
    stability="request",
    description="a counter incremented on every call by the application",
))

register(BreakerKind(
    name="nonce",
    labels=("Nonce", "Cache-buster", "Token", "Signature", "Firma", "Jeton", "Одноразовый код", "ノンス"),
    forms={
        "base64": lambda c: base64.b64encode(c.rng.getrandbits(144).to_bytes(18, "big")).decode(),
        "base64url": lambda c: base64.urlsafe_b64encode(c.rng.getrandbits(144).to_bytes(18, "big"))
        .decode().rstrip("="),
        "hex": lambda c: f"{c.rng.getrandbits(96):024x}",
    },
    stability="request",
    description="an opaque random token (signatures, cache-busters, API nonces)",
))

# Dates and times written in words (en, de, fr, es), in a labelled line or inside a sentence.
_MONTHS_L = {
    "en": _MONTHS,
    "de": "Januar Februar März April Mai Juni Juli August September Oktober November Dezember".split(),
    "fr": "janvier février mars avril mai juin juillet août septembre octobre novembre décembre".split(),
    "es": "enero febrero marzo abril mayo junio julio agosto septiembre octubre noviembre diciembre".split(),
}
_DAYS_L = {
    "en": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
    "de": "Montag Dienstag Mittwoch Donnerstag Freitag Samstag Sonntag".split(),
    "fr": "lundi mardi mercredi jeudi vendredi samedi dimanche".split(),
    "es": "lunes martes miércoles jueves viernes sábado domingo".split(),
}


def words_date(lang: str, t: float) -> str:
    """`Monday, 20 November 2026` / `Montag, 20. November 2026` / `lundi 20 novembre 2026` /
    `lunes, 20 de noviembre de 2026`."""
    g = _gm(t)
    day, month = _DAYS_L[lang][g.tm_wday], _MONTHS_L[lang][g.tm_mon - 1]
    return {"en": f"{day}, {g.tm_mday} {month} {g.tm_year}", "de": f"{day}, {g.tm_mday}. {month} {g.tm_year}",
            "fr": f"{day} {g.tm_mday} {month} {g.tm_year}",
            "es": f"{day}, {g.tm_mday} de {month} de {g.tm_year}"}[lang]


def words_time(lang: str, t: float) -> str:
    """The date in words with the time to the minute, as each language writes it."""
    g = _gm(t)
    d = words_date(lang, t)
    return {"en": f"{d}, {g.tm_hour:02d}:{g.tm_min:02d}", "de": f"{d}, {g.tm_hour:02d}:{g.tm_min:02d} Uhr",
            "fr": f"{d} à {g.tm_hour:02d}h{g.tm_min:02d}", "es": f"{d}, {g.tm_hour:02d}:{g.tm_min:02d}"}[lang]


TEXT_STYLES = ("colon", "bracket", "sentence", "sentence")

register(BreakerKind(
    name="date_words",
    labels=("Today's date", "Datum", "Date du jour", "Fecha del día"),
    forms={f"words_{lang}": (lambda c, lang=lang: words_date(lang, c.time)) for lang in _MONTHS_L},  # type: ignore[misc]  # lang= binds
    stability="day",
    description="today's date written in words (en, de, fr, es), in a line or a sentence",
    styles=TEXT_STYLES,
))

register(BreakerKind(
    name="timestamp_words",
    labels=("Current time", "Aktuelle Zeit", "Heure de la requête", "Fecha y hora"),
    forms={f"words_{lang}": (lambda c, lang=lang: words_time(lang, c.time)) for lang in _MONTHS_L},  # type: ignore[misc]  # lang= binds
    stability="request",
    description="the date and time in words to the minute (en, de, fr, es), in a line or a sentence",
    styles=TEXT_STYLES,
))

# Kinds that live in message text rather than in a labelled field line; `--breakers all` keeps to the
# classic kinds (so the sample logs' commands reproduce them), `text` selects these.
TEXT_KINDS: tuple[str, ...] = ("date_words", "timestamp_words")
CLASSIC_KINDS: tuple[str, ...] = tuple(k for k in REGISTRY if k not in TEXT_KINDS)
DEFAULT_KINDS: tuple[str, ...] = ("timestamp", "request_id", "user_name")
