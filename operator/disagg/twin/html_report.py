"""The HTML report writer of ``disagg simulate`` (:mod:`disagg.twin.report`) and ``disagg demo``.

A page is a title and a sequence of blocks, each an HTML fragment made by the functions below (they
escape what they are given; :func:`paragraph` takes markup its caller built). Plots are plotly figures
(:func:`figure`): zoom, pan and hover in the browser, drawn by plotly.js, which :func:`page` embeds once in
the page's head when a block holds a figure, so the file works offline (no CDN: an air-gapped reader sees
the same page). :func:`figures` reads the figures of a written page back (what plotly.js is handed),
for tests and for scripts over reports.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Mapping, Sequence
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}"
    "table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left;vertical-align:top}"
    "pre{overflow-x:auto}details{margin:.5em 0}summary{cursor:pointer}.figure{margin:0 0 1.5em}"
)
# what every figure's toolbar offers: no plotly logo, PNG export at the size on screen, scroll to zoom
CONFIG: dict[str, Any] = {"displaylogo": False, "responsive": True, "scrollZoom": False}
# the class plotly gives a figure's div: a page holding one needs plotly.js
_FIGURE_CLASS = 'class="plotly-graph-div"'
_NEW_PLOT = "Plotly.newPlot("


def heading(text: str, level: int = 2) -> str:
    return f"<h{level}>{html.escape(text)}</h{level}>"


def paragraph(markup: str) -> str:
    """A paragraph of markup the caller built (escape what it interpolates)."""
    return f"<p>{markup}</p>"


def preformatted(text: str) -> str:
    return f"<pre>{html.escape(text)}</pre>"


def bullets(items: Sequence[str]) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(item)}</li>" for item in items) + "</ul>"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """One row per mapping, the named columns in order (a missing key is an empty cell)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(row.get(c, '')))}</td>" for c in columns) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def details(summary: str, block: str) -> str:
    """A block folded under a one-line summary (long tables: every decision of a run)."""
    return f"<details><summary>{html.escape(summary)}</summary>{block}</details>"


def figure(fig: Any, div_id: str) -> str:
    """A plotly figure as a div and the call that draws it (plotly.js comes once per page, from
    :func:`page`). ``div_id`` names it on the page (and in :func:`figures`)."""
    markup: str = fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id, config=CONFIG)
    return f'<div class="figure">{markup}</div>'


@functools.cache
def plotly_js() -> str:
    """plotly.js as the installed plotly package ships it (minified, ~4.8 MB)."""
    from plotly.offline import get_plotlyjs

    js: str = get_plotlyjs()
    return js


def page(title: str, blocks: Sequence[str]) -> str:
    """The whole document: the title as heading, then the blocks; plotly.js inline in the head when a
    block holds a figure."""
    script = (
        f'<script type="text/javascript">{plotly_js()}</script>\n'
        if any(_FIGURE_CLASS in block for block in blocks)
        else ""
    )
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
        f"<style>{STYLE}</style>\n{script}</head><body>\n{heading(title, 1)}\n"
        + "\n".join(blocks)
        + "\n</body></html>\n"
    )


def write_page(path: Path, title: str, blocks: Sequence[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(title, blocks))
    return path


class _Scripts(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "script":
            self._in_script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def scripts(text: str) -> list[str]:
    """The text of every script element of a page, in order."""
    parser = _Scripts()
    parser.feed(text)
    parser.close()
    return parser.scripts


def figures(text: str) -> dict[str, dict[str, Any]]:
    """Every figure of a page as plotly.js gets it: div id -> {"data": [...], "layout": {...},
    "config": {...}} (the arguments of its ``Plotly.newPlot`` call, which are JSON)."""
    decoder = json.JSONDecoder()
    out: dict[str, dict[str, Any]] = {}
    for script in scripts(text):
        at = script.find(_NEW_PLOT)
        if at < 0 or not script.lstrip().startswith("window.PLOTLYENV"):  # plotly.js names it too
            continue
        pos = at + len(_NEW_PLOT)
        args: list[Any] = []
        while len(args) < 4:
            while script[pos] in " \t\r\n,":
                pos += 1
            value, pos = decoder.raw_decode(script, pos)
            args.append(value)
        div_id, data, layout, config = args
        out[div_id] = {"data": data, "layout": layout, "config": config}
    return out
