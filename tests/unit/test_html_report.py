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
            html_report.details("all <rows>", "<p>folded</p>"),
        ],
    )
    text = path.read_text()
    assert "<title>run &lt;1&gt;</title>" in text and "<h1>run &lt;1&gt;</h1>" in text
    assert "<p>SLO &le; 1 s</p>" in text  # a paragraph is markup its caller built
    assert "<td>&lt;b&gt;x&lt;/b&gt;</td>" in text
    assert "<tr><td>t2</td><td></td></tr>" in text  # a missing key is an empty cell
    assert "<li>a &amp; b</li>" in text and "<pre>x &lt; y</pre>" in text
    assert "<details><summary>all &lt;rows&gt;</summary><p>folded</p></details>" in text
    order = [text.index(s) for s in ("<p>", "<table>", "<ul>", "<pre>", "<details>")]
    assert order == sorted(order)
    assert not html_report.scripts(text)  # no figure, no plotly.js


def test_figures_come_back_from_the_page_with_plotly_js_inline_once(tmp_path: Path) -> None:
    """Two figures: plotly.js once, in the head (the page needs no network); each figure's data, layout
    and config read back from its Plotly.newPlot call as the browser gets them."""
    import plotly.graph_objects as go

    one = go.Figure(go.Scatter(x=[0, 1, 2], y=[1.0, None, 3.0], name="a <b>", meta={"kind": "k"}))
    two = go.Figure(go.Bar(x=["p", "d"], y=[2, 1], name="replicas"))
    path = html_report.write_page(
        tmp_path / "r.html", "figs", [html_report.figure(one, "one"), html_report.figure(two, "two")]
    )
    text = path.read_text()
    bundles = [s for s in html_report.scripts(text) if s.startswith("/**") and "plotly.js v" in s[:100]]
    assert len(bundles) == 1 and text.index(bundles[0]) < text.index("<body>")
    assert "cdn" not in text[: text.index(bundles[0])].lower()  # no script loaded from elsewhere
    assert 'src="http' not in text
    figs = html_report.figures(text)
    assert list(figs) == ["one", "two"]
    (a,) = figs["one"]["data"]
    assert (a["name"], a["x"], a["y"], a["meta"]) == ("a <b>", [0, 1, 2], [1.0, None, 3.0], {"kind": "k"})
    assert figs["two"]["data"][0]["type"] == "bar"
    assert figs["one"]["config"]["displaylogo"] is False
    assert 4_000_000 < len(text) < 6_000_000  # plotly.js is ~4.8 MB; the figures add little
