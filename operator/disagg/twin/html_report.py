"""The HTML report writer of ``disagg simulate`` (:mod:`disagg.twin.report`) and ``disagg demo``.

A page is a title and a sequence of blocks, each an HTML fragment made by the functions below (they
escape what they are given; :func:`paragraph` takes markup its caller built). Plots are matplotlib
figures drawn off-screen (:func:`pyplot`), either embedded in the page (:func:`embedded_figure`: one
self-contained file) or saved beside it and linked (:func:`image`).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

STYLE = (
    "body{font-family:sans-serif;max-width:1100px;margin:2em auto}table{border-collapse:collapse}"
    "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
)


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the off-screen Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def image(src: str, alt: str, width: str | None = None) -> str:
    """An image: a file beside the page, or a data URI."""
    size = f' width="{html.escape(width)}"' if width else ""
    return f'<img src="{html.escape(src)}" alt="{html.escape(alt)}"{size}>'


def embedded_figure(figure: Any, alt: str, dpi: int = 90) -> str:
    """A matplotlib figure as a PNG inside the page; the figure is closed."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(figure)
    return image(f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}", alt)


def page(title: str, blocks: Sequence[str]) -> str:
    """The whole document: the title as heading, then the blocks."""
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>\n'
        f"<style>{STYLE}</style></head><body>\n{heading(title, 1)}\n"
        + "\n".join(blocks)
        + "\n</body></html>\n"
    )


def write_page(path: Path, title: str, blocks: Sequence[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page(title, blocks))
    return path
