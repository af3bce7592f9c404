"""The one HTML report writer of `disagg simulate` and `disagg demo` (disagg.twin.html_report)."""

from __future__ import annotations

from pathlib import Path

from disagg.twin import html_report


def test_a_page_escapes_what_it_is_given_and_keeps_the_block_order(tmp_path: Path) -> None:
    rows = [{"time": "t1", "message": "<b>x</b>"}, {"time": "t2"}]
    path = html_report.write_page(
        tmp_path / "sub" / "report.html",
        "run <1>",
        [
            html_report.paragraph("SLO &le; 1 s"),
            html_report.table(rows, ["time", "message"]),
            html_report.bullets(["a & b"]),
            html_report.preformatted("x < y"),
            html_report.image("timeline.png", "plot", width="100%"),
        ],
    )
    text = path.read_text()
    assert "<title>run &lt;1&gt;</title>" in text and "<h1>run &lt;1&gt;</h1>" in text
    assert "<p>SLO &le; 1 s</p>" in text  # a paragraph is markup its caller built
    assert "<td>&lt;b&gt;x&lt;/b&gt;</td>" in text
    assert "<tr><td>t2</td><td></td></tr>" in text  # a missing key is an empty cell
    assert "<li>a &amp; b</li>" in text and "<pre>x &lt; y</pre>" in text
    assert '<img src="timeline.png" alt="plot" width="100%">' in text
    order = [text.index(s) for s in ("<p>", "<table>", "<ul>", "<pre>", "<img")]
    assert order == sorted(order)


def test_an_embedded_figure_is_a_png_data_uri() -> None:
    fig, ax = html_report.pyplot().subplots()
    ax.plot([0, 1], [1, 0])
    block = html_report.embedded_figure(fig, "line")
    assert block.startswith('<img src="data:image/png;base64,iVBORw0KGgo') and 'alt="line"' in block
    assert not html_report.pyplot().get_fignums()  # the figure was closed
