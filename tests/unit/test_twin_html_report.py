"""The report an SRE decides from (`disagg simulate --out`): the figures' data read back from the written
page as plotly.js gets it, checked against the simulation; and, where a headless Chromium is installed,
the page drawn by a real browser."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from disagg.cli import main
from disagg.twin import html_report
from disagg.twin.cli_simulate import load_policy, policy_controller, slo_settings
from disagg.twin.decisions import DecisionRecord, PolicyTrace, policy_run_trace
from disagg.twin.report import build_report, explain, windows, write_html
from disagg.twin.sim import SimDeployment, SimResult, simulate
from disagg.twin.traffic import load_trace

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "traces" / "mooncake-sample.jsonl"
DD = ROOT / "examples" / "vllm-nixl.yaml"
POLICY = ROOT / "policies" / "chat.yaml"


def kind(fig: dict[str, Any], what: str, run: str | None = None) -> list[dict[str, Any]]:
    return [
        t for t in fig["data"] if t["meta"]["kind"] == what and (run is None or t["meta"].get("run") == run)
    ]


def named(fig: dict[str, Any], name: str) -> dict[str, Any]:
    (trace,) = [t for t in fig["data"] if t.get("name") == name]
    return trace


@pytest.fixture(scope="module")
def bound_run() -> tuple[SimResult, PolicyTrace, Any]:
    """Long Mooncake prompts on the 70B example under the chat policy: prefill climbs to its maxReplicas
    (4) and stays there while almost no request meets the 1 s TTFT target (as `disagg simulate` runs it)."""
    policy = load_policy(POLICY)
    slo = slo_settings(argparse.Namespace(ttft_slo=None, itl_slo=None), policy)
    dep = SimDeployment.load(DD)
    log: list[DecisionRecord] = []
    ctl = policy_controller(policy.spec, dep, log)
    res = simulate(
        dep,
        load_trace(TRACE),
        controller=ctl,
        interval_s=slo.interval_s,
        percentile=slo.percentile,
        window_s=slo.window_s,
    )
    return res, policy_run_trace(res, log, dep, policy.spec, slo.ttft_s, slo.itl_s, slo.percentile), slo


@pytest.fixture(scope="module")
def page(bound_run: tuple[SimResult, PolicyTrace, Any], tmp_path_factory: pytest.TempPathFactory) -> str:
    res, trace, slo = bound_run
    rep = build_report(res, slo.ttft_s, slo.itl_s, slo.percentile, label="pd policy")
    path = write_html(
        tmp_path_factory.mktemp("r") / "report.html", [("pd policy", res)], [rep], traces={"pd policy": trace}
    )
    return path.read_text()


def test_the_page_is_one_offline_file_with_plotly_js_once(page: str) -> None:
    bundles = [s for s in html_report.scripts(page) if s.startswith("/**") and "plotly.js v" in s[:100]]
    assert len(bundles) == 1
    assert "<script src=" not in page and 'src="http' not in page
    assert set(html_report.figures(page)) == {"load", "latency", "attainment"}
    assert len(page) < 5_500_000  # plotly.js ~4.8 MB + the figures


def test_load_is_what_arrived_per_window_under_the_replicas(
    bound_run: tuple[SimResult, PolicyTrace, Any], page: str
) -> None:
    res, _, _ = bound_run
    fig = html_report.figures(page)["load"]
    n = len(res.timeline)
    assert n > 5
    ends = np.array([p["time"] for p in res.timeline])
    starts = np.concatenate([[0.0], ends[:-1]])
    inside = res.arrival < ends[-1]
    for name, per_request in (
        ("arrivals/s", np.ones_like(res.arrival)),
        ("prompt tokens/s", res.prompt),
        ("output tokens/s", res.output),
    ):
        trace = named(fig, name)
        assert len(trace["x"]) == len(trace["y"]) == n
        assert trace["x"] == pytest.approx(list((starts + ends) / 2))
        total = sum(y * (b - a) for y, a, b in zip(trace["y"], starts, ends, strict=True))
        assert total == pytest.approx(float(per_request[inside].sum()))
    assert (
        named(fig, "prompt tokens/s")["yaxis"] == "y2"
    )  # tokens/s on the right axis, requests/s on the left
    replicas = kind(fig, "replicas", "pd policy")
    allocated = {t["meta"]["role"]: t for t in replicas if t["meta"]["state"] == "allocated"}
    assert set(allocated) == {"prefill", "decode"}
    assert allocated["prefill"]["line"]["shape"] == "hv" and max(allocated["prefill"]["y"]) == 4
    assert allocated["prefill"]["xaxis"] == "x2"  # the row under the load, x axis shared with it
    assert fig["layout"]["xaxis"]["matches"] == "x3" or fig["layout"]["xaxis2"]["matches"] == "x3"


def test_every_decision_is_a_marker_whose_hover_is_its_cause(
    bound_run: tuple[SimResult, PolicyTrace, Any], page: str
) -> None:
    _, trace, _ = bound_run
    (marks,) = kind(html_report.figures(page)["load"], "decisions", "pd policy")
    assert len(marks["x"]) == len(marks["y"]) == len(marks["text"]) == len(trace.decisions) > 0
    for d, x, y, text in zip(trace.decisions, marks["x"], marks["y"], marks["text"], strict=True):
        assert (x, y) == (d.time, d.cause)
        assert (
            text.startswith(f"<b>{d.cause}</b> at {d.time:.0f} s") and f"P:D {d.prefill}:{d.decode}" in text
        )
    symbols = marks["marker"]["symbol"]
    assert symbols.count("circle") == sum(d.changed for d in trace.decisions)
    assert any("bound: prefill maxReplicas (4) (SLO missed)" in t for t in marks["text"])


def test_the_spans_a_bound_held_are_shaded_and_say_so(
    bound_run: tuple[SimResult, PolicyTrace, Any], page: str
) -> None:
    _, trace, _ = bound_run
    assert trace.missed and trace.held
    fig = html_report.figures(page)["load"]
    bands = kind(fig, "bound", "pd policy")
    missed = [b for b in bands if b["meta"]["missed"]]
    assert len(missed) == len(trace.missed) and len(bands) == len(trace.held) + len(trace.missed)
    for band, span in zip(missed, trace.missed, strict=True):
        assert band["meta"]["bound"] == span.bound == "prefill maxReplicas (4)"
        assert (min(band["x"]), max(band["x"])) == (span.start, span.end)
        assert band["fill"] == "toself" and band["hoveron"] == "fills"
        assert band["text"].startswith(f"{span.bound} held while the SLO was missed, {span.start:.0f}-")
    rects = [s for s in fig["layout"]["shapes"] if s["type"] == "rect"]
    assert len(rects) == 2 * len(bands)  # over the load row and the decision row too
    assert "The policy was held back: prefill maxReplicas (4) bound for" in page


def test_latency_percentiles_per_window_against_the_slo_lines(
    bound_run: tuple[SimResult, PolicyTrace, Any], page: str
) -> None:
    res, _, slo = bound_run
    fig = html_report.figures(page)["latency"]
    lines = {t["meta"]["metric"]: t for t in kind(fig, "slo")}
    assert lines["ttft"]["y"] == [slo.ttft_s, slo.ttft_s] and lines["itl"]["y"] == [slo.itl_s, slo.itl_s]
    assert (slo.ttft_s, slo.itl_s) == (1.0, 0.04)  # the chat policy's
    series = kind(fig, "latency", "pd policy")
    assert {(t["meta"]["metric"], t["meta"]["quantile"]) for t in series} == {
        (m, q) for m in ("ttft", "itl") for q in ("p50", "p90", "p99")
    }
    for t in series:
        assert len(t["x"]) == len(t["y"]) == len(res.timeline)
        expected = [p[f"{t['meta']['metric']}_{t['meta']['quantile']}"] for p in res.timeline]
        assert t["y"] == pytest.approx(expected)
    assert fig["layout"]["yaxis"]["type"] == fig["layout"]["yaxis2"]["type"] == "log"


def test_attainment_per_window_against_the_target(
    bound_run: tuple[SimResult, PolicyTrace, Any], page: str
) -> None:
    res, _, slo = bound_run
    fig = html_report.figures(page)["attainment"]
    both = named(fig, "pd policy both targets")
    win = windows(res, slo.ttft_s, slo.itl_s)
    assert len(both["x"]) == len(both["y"]) == len(res.timeline) == len(win)
    good = res.met_slo(slo.ttft_s, slo.itl_s)
    for (a, b), y in zip(zip(win.start, win.end, strict=True), both["y"], strict=True):
        arriving = (res.arrival >= a) & (res.arrival < b)
        if arriving.any():
            assert y == pytest.approx(good[arriving].mean())
        else:
            assert y is None  # a gap, not 0%
    assert named(fig, "pd policy TTFT met")["visible"] == "legendonly"
    (target,) = kind(fig, "slo")
    assert target["y"] == [slo.percentile, slo.percentile] == [0.9, 0.9]


def test_legends_sit_above_the_plots(page: str) -> None:
    for fig in html_report.figures(page).values():
        legend = fig["layout"]["legend"]
        assert legend["orientation"] == "h" and legend["y"] > 1 and legend["yanchor"] == "bottom"


def test_the_summary_says_why_attainment_is_what_it_is(bound_run: tuple[SimResult, PolicyTrace, Any]) -> None:
    res, trace, slo = bound_run
    rep = build_report(res, slo.ttft_s, slo.itl_s, slo.percentile, label="pd")
    text = " ".join(explain(res, rep, trace))
    assert text.startswith(
        f"pd: {rep.slo_attainment:.1%} of {rep.requests} requests met both targets, which is below"
    )
    assert f"missed only the TTFT target (p90 {rep.ttft_p90:.2f} s against 1 s)" in text
    assert "while a pool was changing size" in text
    assert "The policy was held back: prefill maxReplicas (4) bound for" in text
    assert f"It decided {len(trace.decisions)} times" in text


def test_many_runs_each_get_their_series_and_one_load(
    bound_run: tuple[SimResult, PolicyTrace, Any], tmp_path: Path
) -> None:
    """The policy run, the same deployment static and its colocated equivalent (one load: the same
    requests), and a run on half the requests (its own load, named): every run its replicas, latency and
    attainment; decisions only where a trace was given."""
    res, trace, slo = bound_run
    dep = SimDeployment.load(DD)
    reqs = load_trace(TRACE)
    static = simulate(dep, reqs, interval_s=slo.interval_s)
    colocated = simulate(dep.colocated_equivalent(), reqs, interval_s=slo.interval_s)
    half = simulate(dep, reqs[: len(reqs) // 2], interval_s=slo.interval_s)
    runs = [("policy", res), ("static", static), ("colocated", colocated), ("half", half)]
    reports = [build_report(r, slo.ttft_s, slo.itl_s, slo.percentile, label=label) for label, r in runs]
    text = write_html(tmp_path / "r.html", runs, reports, traces={"policy": trace}).read_text()
    figs = html_report.figures(text)
    load = figs["load"]
    assert [t["name"] for t in kind(load, "load")] == [
        "arrivals/s",
        "prompt tokens/s",
        "output tokens/s",
        "half: arrivals/s",
        "half: prompt tokens/s",
        "half: output tokens/s",
    ]
    roles = {(t["meta"]["run"], t["meta"]["role"]) for t in kind(load, "replicas")}
    assert roles == {
        (label, role) for label in ("policy", "static", "half") for role in ("prefill", "decode")
    } | {("colocated", "colocated")}
    assert [t["meta"]["run"] for t in kind(load, "decisions")] == ["policy"]
    for label, r in runs:
        assert len(kind(figs["latency"], "latency", label)) == 6
        (both,) = [
            t for t in kind(figs["attainment"], "attainment", label) if t["meta"]["series"] == "both targets"
        ]
        assert len(both["y"]) == len(r.timeline)
    assert "By attainment: " in text and "No policy ran: the replicas stayed as configured." in text
    with pytest.raises(ValueError, match="2 results but 1 reports"):
        write_html(tmp_path / "x.html", runs[:2], reports[:1])


def test_simulate_out_writes_the_decisions_and_bounds_into_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(TRACE), "--deployment", str(DD), "--policy", str(POLICY)]
    assert main([*argv, "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    text = (out / "report.html").read_text()
    fig = html_report.figures(text)["load"]
    label = summary["runs"][0]["label"]
    (marks,) = kind(fig, "decisions", label)
    assert len(marks["x"]) == len(summary["decisions"]) > 0
    assert [m for m in marks["y"]] == [d["cause"] for d in summary["decisions"]]
    assert any(b["meta"]["missed"] for b in kind(fig, "bound", label))
    assert f"{label}: {len(summary['decisions'])} decisions" in text  # the decision table


CHROMIUM = next(
    (
        path
        for name in ("chromium-headless-shell", "chromium", "google-chrome")
        if (path := shutil.which(name))
    ),
    None,
)


@pytest.mark.skipif(CHROMIUM is None, reason="no headless Chromium (apt-get install chromium-headless-shell)")
def test_a_headless_browser_draws_every_figure(page: str, tmp_path: Path) -> None:
    """The page in a real browser, offline: every figure drawn as SVG (plotly.js ran), its legend entries
    and the decision markers there, and nothing logged as an uncaught error."""
    path = tmp_path / "report.html"
    path.write_text(page)
    assert CHROMIUM is not None
    run = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--virtual-time-budget=15000",
            "--window-size=1280,2400",
            "--dump-dom",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    dom = run.stdout
    assert "Uncaught" not in run.stderr, run.stderr[-2000:]
    figs = html_report.figures(page)
    for div_id, fig in figs.items():
        at = dom.index(f'id="{div_id}"')
        drawn = dom[at : dom.find('class="figure"', at + 1) if div_id != "attainment" else len(dom)]
        assert 'class="main-svg"' in drawn, div_id
        shown = [t["name"] for t in fig["data"] if t.get("showlegend", True) is not False and "name" in t]
        for name in shown:
            assert f">{name}<" in drawn.replace("&lt;", "<").replace("&gt;", ">"), (div_id, name)
    load = dom[dom.index('id="load"') : dom.index('id="latency"')]
    (marks,) = kind(figs["load"], "decisions")
    assert load.count('class="point"') >= len(marks["x"])
