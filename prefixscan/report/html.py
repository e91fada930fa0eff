"""The report as one self-contained HTML file: inline CSS, figures inlined as SVG, no script, no network.

A Content-Security-Policy forbids every external load, so the file behaves the same attached to a
ticket, opened offline or mailed. Content comes from `markdown.document`; this module only formats.
"""

from __future__ import annotations

import html
import re

from prefixscan.report.escape import html_inline, html_text, plain, visible
from prefixscan.report.figures import Figure
from prefixscan.report.markdown import document
from prefixscan.report.model import ReportData

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;font-size:14px;line-height:1.45;
color:#1b1f23;max-width:1100px;margin:0 auto;padding:24px 32px}
h1{font-size:24px;border-bottom:2px solid #ddd;padding-bottom:6px}
h2{font-size:19px;margin-top:34px;border-bottom:1px solid #e4e4e4;padding-bottom:4px}
h3{font-size:15px;margin-top:22px}
table{border-collapse:collapse;margin:10px 0;font-size:12.5px}
th,td{border:1px solid #d8dee4;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f3f5f7}
tr:nth-child(even) td{background:#fafbfc}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,pre{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12.5px;background:#f3f5f7}
code{padding:1px 4px;border-radius:3px}
pre{padding:10px;overflow-x:auto;border-radius:4px}
figure{margin:14px 0}
figure svg{max-width:100%;height:auto}
figcaption{font-size:12px;color:#57606a}
.missing{border-left:4px solid #d4a72c;background:#fff8e1;padding:8px 12px}
nav ol{columns:2;font-size:13px}
"""
_NUMERIC = re.compile(r"^[-$]?[\d,.]+(\s?[kMBG%]|\s?GiB|\s?ms|\s?s|\s?req/s)?$|^n/a$")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", plain(text).lower()).strip("-")


def embed_svg(fig: Figure) -> str:
    """Inline a matplotlib SVG: drop the XML prologue and prefix ids so figures cannot collide."""
    svg = fig.svg
    svg = re.sub(r"<\?xml[^>]*\?>\s*", "", svg)
    svg = re.sub(r"<!DOCTYPE[^>]*>\s*", "", svg)
    pre = f"{fig.name}-"
    svg = re.sub(r'\bid="([^"]+)"', lambda m: f'id="{pre}{m.group(1)}"', svg)
    svg = re.sub(r"url\(#([^)]+)\)", lambda m: f"url(#{pre}{m.group(1)})", svg)
    svg = re.sub(r'href="#([^"]+)"', lambda m: f'href="#{pre}{m.group(1)}"', svg)
    svg = svg.replace("<svg ", f'<svg role="img" aria-label="{html_text(fig.alt)}" ', 1)
    return svg.strip()


def _table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html_inline(h)}</th>" for h in head)
    body = []
    for r in rows:
        tds = "".join(f'<td class="n">{html_inline(c)}</td>' if _NUMERIC.match(plain(c)) else
                      f"<td>{html_inline(c)}</td>" for c in r)
        body.append(f"<tr>{tds}</tr>")
    return f"<table><thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render(data: ReportData, figures: dict[str, Figure]) -> str:
    """The HTML document text."""
    blocks = document(data, figures)
    parts: list[str] = []
    toc: list[str] = []
    title = "prefixscan report"
    for b in blocks:
        kind = b[0]
        if kind == "h":
            level, text = b[1], b[2]
            if level == 1:
                title = text
                parts.append(f"<h1>{html_inline(text)}</h1>\n<!--TOC-->")
                continue
            ident = slug(text)
            if level == 2:
                toc.append(f'<li><a href="#{ident}">{html_inline(text)}</a></li>')
            parts.append(f'<h{level} id="{ident}">{html_inline(text)}</h{level}>')
        elif kind == "p":
            parts.append(f"<p>{html_inline(b[1])}</p>")
        elif kind == "missing":
            parts.append(f'<p class="missing">{html_inline(b[1])}</p>')
        elif kind in ("ul", "ol"):
            items = "".join(f"<li>{html_inline(x)}</li>" for x in b[1])
            parts.append(f"<{kind}>{items}</{kind}>")
        elif kind == "table":
            parts.append(_table(b[1], b[2]))
        elif kind == "fig":
            f = figures[b[1]]
            parts.append(
                f'<figure id="fig-{f.name}" class="figure">{embed_svg(f)}'
                f"<figcaption>{html_inline(f.alt)}</figcaption></figure>"
            )
        elif kind == "code":
            parts.append(f"<pre><code>{html.escape(plain(visible(b[1])), quote=False)}</code></pre>")
    nav = f"<nav><ol>{''.join(toc)}</ol></nav>"
    body = "\n".join(parts).replace("<!--TOC-->", nav, 1)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html_text(plain(title))}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )
