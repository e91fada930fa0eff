"""The report as a list of renderer-neutral blocks, and those blocks rendered as Markdown.

`document(data)` decides what the report says, once; `render` (here) and `prefixscan.report.html.render`
only format the blocks. Inline markup inside text is limited to **bold** and `code`; data values inside
block text are wrapped by `escape.data` and escaped by each renderer for its medium. Every number is
read from the ReportData; nothing is computed here beyond formatting.
"""

from __future__ import annotations

from collections.abc import Callable

from prefixscan.report.escape import data as esc
from prefixscan.report.escape import markdown, markdown_code_block, markdown_inline
from prefixscan.report.figures import Figure
from prefixscan.report.model import ReportData
from prefixscan.report.sections.blocks import Block
from prefixscan.report.sections.findings import comparison, findings, misses
from prefixscan.report.sections.fleet import appendix, cost, plan, policies, rollout, scenario
from prefixscan.report.sections.pilot import pilot
from prefixscan.report.sections.traffic import capacity, prefixes, reuse, summary, traffic

# The report's sections in order; each is one function data -> blocks. A new section is one more function
# in this tuple. A section names the figures it shows; `document` drops those that were not drawn.
Section = Callable[[ReportData], list[Block]]
SECTIONS: tuple[Section, ...] = (scenario, summary, comparison, traffic, reuse, capacity, prefixes, findings, misses,
                                 pilot, policies, cost, plan, rollout, appendix)


def document(data: ReportData, figures: dict[str, Figure], sections: tuple[Section, ...] = SECTIONS) -> list[Block]:
    """The report's content as blocks; figure blocks whose figure is absent are dropped."""
    blocks: list[Block] = [("h", 1, f"prefixscan report: {esc(data.run_path)}")]
    for section in sections:
        blocks.extend(b for b in section(data) if b[0] != "fig" or b[1] in figures)
    return blocks


def _cell(text: str) -> str:
    """Table cell: inline text on one line, every pipe escaped (GFM splits cells before inline parsing)."""
    return markdown_inline(text).replace("\n", " ").replace("|", "\\|")


def render(data: ReportData, figures: dict[str, Figure], figure_dir: str = "report_figures") -> str:
    """Markdown text; figures are linked as `figure_dir/NAME.svg` (written next to report.md). Every block's
    text goes through `escape.markdown_inline`, which escapes the data values in it (`escape.data`)."""
    out: list[str] = []
    for b in document(data, figures):
        kind = b[0]
        if kind == "h":
            out.append(f"{'#' * b[1]} {markdown_inline(b[2])}")
        elif kind == "p":
            out.append(markdown_inline(b[1]))
        elif kind == "missing":
            out.append(f"> {markdown_inline(b[1])}")
        elif kind in ("ul", "ol"):
            out.append("\n".join(f"{f'{i}.' if kind == 'ol' else '-'} {markdown_inline(x)}"
                                 for i, x in enumerate(b[1], 1)))
        elif kind == "table":
            head, rows = b[1], b[2]
            lines = ["| " + " | ".join(_cell(h) for h in head) + " |", "|" + "---|" * len(head)]
            lines += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
            out.append("\n".join(lines))
        elif kind == "fig":
            f = figures[b[1]]
            out.append(f"![{markdown(f.alt)}]({figure_dir}/{f.name}.svg)")
        elif kind == "code":
            out.append(markdown_code_block(b[1]))
    return "\n\n".join(out) + "\n"
