"""Every value from the data, escaped for the medium it lands in: one helper per medium, all here.

A value from the data (tenant, model, conversation or request id, file name, snippet, SQL result) can
hold terminal escapes (an OSC 52 clipboard write, a screen clear), a bare CR, bidi overrides, characters
XML 1.0 forbids, or Markdown/HTML that would become a live link or a remote image. So:

- `visible`: the medium-independent step. Control characters (C0 but tab and newline, DEL, C1), bidi
  and zero-width format characters, lone surrogates and the non-characters U+FFFE/U+FFFF are made
  visible as `\\xNN` / `\\uNNNN` text: nothing is silently dropped (two tenants stay two), nothing acts.
- `clean` (one line of plain text for a terminal; `safe` escapes it for Rich markup too), `markdown`,
  `html_text`, `svg_text`: `visible`, then the medium's own escaping. A value printed on a terminal goes
  through `clean` or `safe` only, so `[...]` in the data is never read as Rich markup.

Report blocks (`sections/`) carry trusted template text with two inline marks (**bold**, `code`); a data
value inside such text is wrapped by `data(value)` in two private-use delimiters, so each renderer
(`markdown_inline`, `html_inline`) escapes it as data, never reads markup from it, and keeps it literal
inside code spans. Text outside the delimiters is escaped too (controls made visible; in Markdown, link
and HTML brackets escaped), so a value a section forgot to wrap still cannot act.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterator

_HIDDEN = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069"
    "\ufeff\ufff9-\ufffb\ufffe\uffff\ud800-\udfff]"
)
_BREAKS = re.compile("[\t\n]")
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
OPEN, CLOSE = "\ue000", "\ue001"  # private-use: delimit a data value inside block text
_MARKS = re.compile(f"[{OPEN}{CLOSE}]")
# What Markdown (CommonMark + GFM) could read as markup in a data value: backslash, code, emphasis, link and
# image brackets, strikethrough, math; `_` only at a word edge (inside a word it never emphasises, so
# `round_robin` stays readable); `&` only where it would start an entity; `#` only where it could start or
# close a heading. `<` and `>` (autolinks, raw HTML) become entities.
_MD_DATA = re.compile(r"[\\`*\[\]~$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|&(?=#?\w+;)|(?<!\S)#")
_MD_TEMPLATE = re.compile(r"[\[\]]")  # links and images
_MD_ANGLE = {"<": "&lt;", ">": "&gt;"}


def _show(m: re.Match[str]) -> str:
    o = ord(m.group())
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}"


def visible(value: object) -> str:
    """`value` as text whose control and invisible format characters are shown as `\\xNN`/`\\uNNNN`."""
    return _HIDDEN.sub(_show, "" if value is None else str(value))


def clean(value: object) -> str:
    """A data value as plain text on one line (for a terminal, and the base of the Markdown, SVG and report
    block helpers): `visible(value)`, tabs and newlines become spaces."""
    return _BREAKS.sub(" ", visible(value))


def safe(value: object) -> str:
    """`clean(value)` escaped for Rich markup (`[bold]` in the data prints as itself), for any data value
    inside a printed string or table cell."""
    from rich.markup import escape

    return escape(clean(value))


def markdown(value: object) -> str:
    """A data value for Markdown inline text or a table cell: one line, controls visible, and every
    character Markdown could read as emphasis, code, link, image, HTML, heading or entity escaped (`|` is
    left to the table writer, which escapes every pipe of a cell; a pipe outside a table is text)."""
    return _angles(_MD_DATA.sub(lambda m: "\\" + m.group(), _MARKS.sub("", clean(value))))


def _angles(text: str) -> str:
    return re.sub("[<>]", lambda m: _MD_ANGLE[m.group()], text)


def html_text(value: object) -> str:
    """A data value for HTML text or an attribute: controls visible, then `html.escape` (quotes too)."""
    return html.escape(_MARKS.sub("", visible(value)), quote=True)


def svg_text(value: object) -> str:
    """A data value for a matplotlib figure label: one line, controls visible. matplotlib escapes `&<>`
    itself, and figures are drawn with `text.parse_math` off, so `$` is not read as mathtext."""
    return _MARKS.sub("", clean(value))


def xml_legal(text: str) -> str:
    """`text` with the characters XML 1.0 forbids made visible (a last guard on a whole SVG document)."""
    return _XML_ILLEGAL.sub(_show, text)


def data(value: object) -> str:
    """A data value to interpolate into report block text: delimited, so renderers escape it as data."""
    return OPEN + _MARKS.sub("", clean(value)) + CLOSE


def plain(text: str) -> str:
    """Block text without its data delimiters (for a slug or a title)."""
    return _MARKS.sub("", text)


def runs(text: str) -> Iterator[tuple[str, bool, str]]:
    """Block text as (style, is_data, text) runs; style is "", "code" or "bold". Only template text (outside
    `data` delimiters) opens or closes `code` and **bold**; inside a code span `**` is literal."""
    style_code, bold = False, False
    is_data = False
    for part in re.split(f"([{OPEN}{CLOSE}])", visible(text)):
        if part == OPEN:
            is_data = True
            continue
        if part == CLOSE:
            is_data = False
            continue
        if is_data:
            if part:
                yield ("code" if style_code else "bold" if bold else ""), True, part
            continue
        for tok in re.split(r"(`|\*\*)", part):
            if tok == "`":
                style_code = not style_code
                yield "code_toggle", False, ""
            elif tok == "**" and not style_code:
                bold = not bold
                yield "bold_toggle", False, ""
            elif tok:
                yield ("code" if style_code else "bold" if bold else ""), False, tok


def _fence(content: str) -> str:
    longest = max((len(m) for m in re.findall("`+", content)), default=0)
    tick = "`" * (longest + 1)
    pad = " " if content.startswith("`") or content.endswith("`") or not content.strip() else ""
    return f"{tick}{pad}{content}{pad}{tick}"


def markdown_inline(text: str) -> str:
    """Block text as Markdown: data values escaped, code spans fenced so no data can close them."""
    out: list[str] = []
    code: list[str] | None = None
    for style, is_data, s in runs(text):
        if style == "code_toggle":
            if code is None:
                code = []
            else:
                out.append(_fence("".join(code)) if code else "")
                code = None
        elif code is not None:
            code.append(s.replace("\n", " "))
        elif style == "bold_toggle":
            out.append("**")
        else:
            out.append(markdown(s) if is_data else _angles(_MD_TEMPLATE.sub(lambda m: "\\" + m.group(), s)))
    if code is not None:  # an unclosed span: its text, escaped
        out.append(markdown("`" + "".join(code)))
    return "".join(out)


def html_inline(text: str) -> str:
    """Block text as HTML: everything escaped, then the template's `code` and **bold** as tags."""
    out: list[str] = []
    in_code = in_bold = False
    for style, _is_data, s in runs(text):
        if style == "code_toggle":
            out.append("</code>" if in_code else "<code>")
            in_code = not in_code
        elif style == "bold_toggle":
            out.append("</strong>" if in_bold else "<strong>")
            in_bold = not in_bold
        else:
            out.append(html.escape(s, quote=False))
    out.append("</code>" * in_code + "</strong>" * in_bold)
    return "".join(out)


def markdown_code_block(text: str) -> str:
    """A fenced Markdown code block whose fence no line of `text` can close; controls visible."""
    body = plain(visible(text))
    longest = max((len(m) for m in re.findall("`{3,}|~{3,}", body)), default=2)
    fence = "`" * (longest + 1)
    return f"{fence}\n{body}\n{fence}"
