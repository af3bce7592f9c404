"""Fair comparisons and the recommendation (disagg.twin.compare, ``disagg simulate --compare all`` and
``--recommend``): the searches find what running every candidate finds, stay in the GPU budget and the
TP sizes there are profiles for, and the command line says what is wrong with its flags."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from disagg.cli import main
from disagg.twin import compare
from disagg.twin.compare import SloSettings
from disagg.twin.sim import PoolSpec, SimDeployment
from disagg.twin.traffic import LengthDist, Request, poisson

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "examples" / "traces" / "azure-conv-sample.csv"
SLO = SloSettings(ttft_s=0.5, itl_s=0.03, percentile=0.9, interval_s=15.0, window_s=15.0)
TWIN_8B = "model: llama-3.1-8b\ngpu: h100\nprefill: {replicas: 1, tp: 1}\ndecode: {replicas: 1, tp: 1}\n"


def pd_8b(prefill: int = 1, decode: int = 1) -> SimDeployment:
    return SimDeployment(model="llama-3.1-8b", prefill=PoolSpec(prefill, 1), decode=PoolSpec(decode, 1))


def load(rate: float = 12.0, duration: float = 60.0) -> list[Request]:
    return poisson(rate, duration, LengthDist(3000, 0.8, hi=12000), LengthDist(200, 1.0, hi=1000), seed=5)


def test_the_best_static_split_is_at_least_as_good_as_every_split_run() -> None:
    reqs = load()
    found = compare.best_static_split(pd_8b(), reqs, SLO, gpu_budget=4)
    every = [compare.run_one(d, reqs, SLO) for d in compare.pd_candidates(pd_8b(), 4)]
    assert {d.label for d in every} == {
        f"P/D {p}xTP1 + {d}xTP1 ({p + d} GPUs)" for p in range(1, 4) for d in range(1, 5 - p)
    }
    best = compare.rank_key(found.best.report, SLO.percentile)
    assert all(best >= compare.rank_key(o.report, SLO.percentile) for o in every)
    assert found.candidates == 6 and found.simulated + found.pruned_capacity + found.pruned_bound == 6
    # the configurations differ: the search has something to choose between
    assert len({round(o.report.goodput_per_gpu_hour) for o in every}) > 1


def test_the_best_static_colocated_size_is_at_least_as_good_as_every_size_run() -> None:
    reqs = load()
    found = compare.best_static_colocated(pd_8b(), reqs, SLO, gpu_budget=4)
    every = [compare.run_one(d, reqs, SLO) for d in compare.colocated_candidates(pd_8b(), 4)]
    assert [o.deployment.gpus for o in every] == [1, 2, 3, 4]
    best = compare.rank_key(found.best.report, SLO.percentile)
    assert all(best >= compare.rank_key(o.report, SLO.percentile) for o in every)


def test_recommend_ranks_by_goodput_per_gpu_hour_within_the_budget_and_profiled_tps() -> None:
    reqs = load()
    found = compare.recommend(pd_8b(), reqs, SLO, gpu_budget=4, top=3)
    everything = compare.search(compare.recommend_candidates(pd_8b(), 4), reqs, SLO, keep=3, prune=False)
    assert found.candidates == everything.candidates == everything.simulated
    # pruning never changes the top three
    assert [o.label for o in found.ranked[:3]] == [o.label for o in everything.ranked[:3]]
    keys = [compare.rank_key(o.report, SLO.percentile) for o in everything.ranked]
    assert keys == sorted(keys, reverse=True)
    met = [o for o in everything.ranked if compare.meets(o.report, SLO.percentile)]
    assert met and everything.ranked[: len(met)] == met
    rates = [o.report.goodput_per_gpu_hour for o in met]
    assert rates == sorted(rates, reverse=True)
    layouts = set()
    for o in everything.ranked:
        d = o.deployment
        assert o.report.gpus <= 4 and d.gpus <= 4
        pools = [p for p in (d.prefill, d.decode, d.colocated) if p is not None]
        layouts.add((d.mode, *(p.tp for p in pools)))
        assert all(p.tp in (1, 2, 4) for p in pools)  # 8 does not fit 4 GPUs
    assert ("colocated", 4) in layouts and ("pd", 2, 1) in layouts and ("pd", 1, 2) in layouts


def test_supported_tps_are_those_with_a_profile_that_fit_the_node_and_budget() -> None:
    dep70 = SimDeployment(model="llama-3.1-70b", prefill=PoolSpec(1, 4), decode=PoolSpec(1, 8))
    assert dep70.prefill is not None
    # no bf16 TP2 profile for the 70B model on H100, and its weights do not fit one GPU
    assert compare.supported_tps(dep70, dep70.prefill, 16) == (4, 8)
    assert compare.supported_tps(dep70, dep70.prefill, 4) == (4,)
    small_node = replace(PoolSpec(1, 1), gpus_per_node=2)
    assert compare.supported_tps(pd_8b(), small_node, 8) == (1, 2)
    with pytest.raises(ValueError, match="no configuration"):
        compare.recommend(dep70, load(duration=10.0), SLO, gpu_budget=3)


def test_a_capacity_short_configuration_is_not_simulated() -> None:
    reqs = load(rate=40.0, duration=30.0)
    demand = compare.Demand.of(reqs)
    assert compare.capacity_shortfall(pd_8b(1, 1), demand, SLO.itl_s)
    assert not compare.capacity_shortfall(pd_8b(16, 16), demand, SLO.itl_s)
    found = compare.best_static_split(pd_8b(), reqs, SLO, gpu_budget=3)
    assert found.pruned_capacity >= 1 and found.simulated >= 1


def test_hpa_counts_follow_the_kubernetes_formula() -> None:
    assert compare.hpa_desired(2, 2, 0.9, 0.6) == 3  # ceil(2 x 1.5)
    assert compare.hpa_desired(2, 2, 0.63, 0.6) == 2  # within the tolerance
    assert compare.hpa_desired(4, 2, 0.9, 0.6) == 4  # starting replicas count as idle: 4 x 0.75 of target
    assert compare.hpa_desired(4, 4, 0.15, 0.6) == 1  # ceil(4 x 0.25)


def test_the_colocated_hpa_scales_up_under_load_and_stays_in_the_budget() -> None:
    reqs = load(rate=30.0, duration=120.0)
    dep, most = compare.autoscaled_colocated(pd_8b(1, 1), gpu_budget=6)
    dep = replace(dep, startup_delay_s=20.0)
    assert most == 6 and dep.gpus == 2
    out = compare.run_one(dep, reqs, SLO, controller=compare.hpa_controller(most))
    allocated = [pools["colocated"][0] for _, pools in out.result.replicas]
    assert max(allocated) > 2 and max(allocated) <= 6
    assert out.report.gpus <= 6


@pytest.fixture
def twin_8b(tmp_path: Path) -> Path:
    """The 8B twin deployment as a file for the CLI."""
    path = tmp_path / "dep.yaml"
    path.write_text(TWIN_8B)
    return path


def run_cli(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    rc = main(["simulate", "--trace", str(TRACE), "--duration", "60", "--quiet", *flags])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_compare_all_shows_four_labelled_rows_on_one_budget(
    tmp_path: Path, twin_8b: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    rc, out, _ = run_cli(
        capsys, "--deployment", str(twin_8b), "--compare", "all", "--gpu-budget", "4", "--out", str(out_dir)
    )
    assert rc == 0
    table = out.split("-----\n", 1)[1].splitlines()
    rows = table[:4]
    assert rows[0].startswith("twin P/D ")
    assert rows[1].startswith("best static P/D ") and "xTP1 + " in rows[1]
    assert rows[2].startswith("best static colocated ") and "GPUs)" in rows[2]
    assert rows[3].startswith("colocated HPA 1-4xTP1 autoscaled")
    assert "every row within 4 GPUs (--gpu-budget)" in out
    assert table[4].startswith("compare all:")
    summary = json.loads((out_dir / "summary.json").read_text())
    assert len(summary["runs"]) == 4 and summary["compare"]["gpu_budget"] == 4
    best_pd = summary["compare"]["static_pd"]["top"][0]["report"]["label"]
    assert rows[1].startswith(f"best static {best_pd}")
    assert all(run["gpus"] <= 4 for run in summary["runs"][1:])


def test_compare_colocated_is_still_the_one_colocated_row(
    twin_8b: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, out, _ = run_cli(capsys, "--deployment", str(twin_8b), "--compare", "colocated")
    assert rc == 0
    rows = out.split("-----\n", 1)[1].splitlines()
    assert rows[0].startswith("twin P/D ") and rows[1].startswith("twin colocated ")
    assert "best static" not in out


def test_recommend_prints_and_writes_the_top_configurations(
    tmp_path: Path, twin_8b: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    rc, out, _ = run_cli(
        capsys,
        "--deployment",
        str(twin_8b),
        "--recommend",
        "--gpu-budget",
        "3",
        "--top",
        "2",
        "--out",
        str(out_dir),
    )
    assert rc == 0
    assert "recommend: " in out and "within 3 GPUs" in out and "at least 90% of requests" in out
    rec = json.loads((out_dir / "summary.json").read_text())["recommend"]
    assert rec["gpu_budget"] == 3 and rec["attainment_target"] == 0.9
    assert len(rec["top"]) == 2 and [t["rank"] for t in rec["top"]] == [1, 2]
    assert all(t["report"]["gpus"] <= 3 for t in rec["top"])
    listed = out.split("recommend: ", 1)[1].splitlines()
    assert listed[1].split()[:2] == ["#", "configuration"] and listed[3].startswith("1  ")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--recommend"], "--recommend needs --gpu-budget"),
        (["--top", "3"], "--top is read by --recommend only"),
        (["--gpu-budget", "8"], "--gpu-budget is read by --recommend and --compare all only"),
        (["--gpu-budget", "8", "--compare", "colocated"], "--gpu-budget is read by"),
    ],
)
def test_comparison_flags_without_what_reads_them_exit_2(
    twin_8b: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    rc, out, err = run_cli(capsys, "--deployment", str(twin_8b), *flags)
    assert rc == 2 and out == ""
    assert err.strip() == f"disagg simulate: {err.strip().removeprefix('disagg simulate: ')}"
    assert message in err


@pytest.mark.parametrize("flags", [["--gpu-budget", "0"], ["--top", "-1"], ["--compare", "split"]])
def test_bad_comparison_values_are_usage_errors(
    twin_8b: Path, capsys: pytest.CaptureFixture[str], flags: list[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run_cli(capsys, "--deployment", str(twin_8b), "--recommend", *flags)
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_a_budget_no_configuration_fits_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run_cli(
        capsys, "--deployment", str(ROOT / "examples" / "vllm-nixl.yaml"), "--recommend", "--gpu-budget", "2"
    )
    assert rc == 2
    assert "fits 2 GPUs (the smallest replica with a latency profile takes 4 GPUs)" in err
