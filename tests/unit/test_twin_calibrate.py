"""``disagg twin calibrate`` (issue 14, item 2): reading a user's benchmark runs, fitting the twin's overhead
knobs to them, and ``disagg simulate --profile``.

The recovery tests generate "measurements" with the twin itself under known, perturbed knobs and check the
fit finds them again: that proves the fitting machinery, not that the twin is faithful to a real engine."""

from __future__ import annotations

import json
from dataclasses import astuple, replace
from pathlib import Path

import pytest
import yaml

from disagg.cli import main
from disagg.clicommon import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from disagg.perf.latency import load_profile_yaml, set_profile_overlay
from disagg.twin import fidelity, fit_measured, profiles
from disagg.twin.measurements import (
    Defaults,
    MeasuredPoint,
    MeasurementError,
    Observed,
    Setup,
    parse_measurements,
    read_measurements,
)

FIXTURES = Path(__file__).parent / "fixtures" / "calibrate"
KEY_8B = "llama-3.1-8b/h100/tp1/bf16"
# Qwen/Qwen2.5-7B-Instruct config.json (the fields the twin reads), a model the shipped profiles lack
QWEN_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_attention_heads": 28,
    "num_hidden_layers": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}


@pytest.fixture(autouse=True)
def _no_overlay() -> object:
    """Every test starts and ends with the shipped profiles only (--profile sets a process-wide overlay)."""
    set_profile_overlay(None)
    profiles.available.cache_clear()
    yield
    set_profile_overlay(None)
    profiles.available.cache_clear()


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code) if isinstance(exc.code, int) else EXIT_FAILURE


# --- readers --------------------------------------------------------------------------------------------
def test_reads_a_vllm_bench_serve_result() -> None:
    (p,) = read_measurements([FIXTURES / "vllm_bench_serve_result.json"])
    s = p.setup
    assert (s.model, s.gpu, s.tp, s.concurrency, s.rate, s.start) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "h100",
        1,
        32,
        None,
        "burst",
    )
    assert (s.prompt_tokens, s.output_tokens, s.num_requests) == (1024, 256, 320)
    assert astuple(p.observed) == pytest.approx((0.2124, 0.0229, 0.1803))


def test_vllm_detailed_lists_give_the_mean_lengths_and_itl_stands_in_for_tpot() -> None:
    doc = json.loads((FIXTURES / "vllm_bench_serve_result.json").read_text())
    doc.update(input_lens=[100, 300], output_lens=[10, 30], request_rate=2.5, max_concurrency=None)
    del doc["mean_tpot_ms"]
    (p,) = parse_measurements(json.dumps(doc), Path("r.json"))
    assert (p.setup.prompt_tokens, p.setup.output_tokens) == (200, 20)
    assert (p.setup.concurrency, p.setup.rate) == (None, 2.5)
    assert p.observed.tpot_mean_s == pytest.approx(0.0228)


def test_reads_an_aiperf_export() -> None:
    (p,) = read_measurements([FIXTURES / "profile_export_aiperf.json"], Defaults(gpu="h100", tp=1))
    s = p.setup
    assert (s.model, s.gpu, s.tp, s.concurrency, s.num_requests) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "h100",
        1,
        16,
        160,
    )
    assert (s.prompt_tokens, s.output_tokens) == (2048, 255.6)
    assert astuple(p.observed) == pytest.approx((0.1486, 0.01945, 0.1399))


def test_aiperf_seconds_are_converted_and_genai_perf_concurrency_is_found() -> None:
    doc = json.loads((FIXTURES / "profile_export_aiperf.json").read_text())
    doc["time_to_first_token"] = {"unit": "s", "avg": 0.25}
    doc["input_config"] = {"model": ["m"], "concurrency": 4}
    (p,) = parse_measurements(json.dumps(doc), Path("g.json"))
    assert (p.setup.model, p.setup.concurrency, p.observed.ttft_mean_s) == ("m", 4, 0.25)


def test_an_aiperf_run_counts_its_start_and_a_genai_perf_one_is_a_steady_state() -> None:
    """AIPerf averages its whole run (clients start together); GenAI-Perf's perf_analyzer measures windows
    until they are stable, so its figures are replayed as the clients' steady state."""
    doc = json.loads((FIXTURES / "profile_export_aiperf.json").read_text())
    (aiperf,) = parse_measurements(json.dumps(doc), Path("a.json"))
    doc["input_config"] = {"model": ["m"], "perf_analyzer": {"stimulus": {"concurrency": 8}}}
    (genai,) = parse_measurements(json.dumps(doc), Path("g.json"))
    assert (aiperf.setup.start, genai.setup.start, genai.setup.concurrency) == ("burst", "steady", 8)


def test_reads_a_csv_with_comments_a_rate_row_and_command_line_defaults() -> None:
    closed, poisson = read_measurements([FIXTURES / "runs.csv"], Defaults(dtype="fp8", gpu="a100"))
    assert (closed.setup.concurrency, closed.setup.rate, closed.setup.start) == (8, None, "steady")
    assert (poisson.setup.concurrency, poisson.setup.rate) == (None, 4.5)
    assert closed.setup.gpu == "h100" and closed.setup.dtype == "fp8"  # the file wins, defaults fill in
    assert astuple(closed.observed)[:2] == pytest.approx((0.095, 0.0121)) and closed.source.endswith(
        "runs.csv line 3"
    )


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ('{"mean_ttft_ms": 1', "invalid JSON at line 1"),
        ('{"hello": 1}', "not a vLLM serving benchmark result"),
        ('{"mean_ttft_ms": 100, "completed": 10, "total_input_tokens": 100}', "no output length"),
        ("model,ttft_ms\nx,1\n", "needs the columns prompt_tokens"),
        (
            "prompt_tokens,output_tokens,ttft_ms,tpot_ms,concurrency\n10,10,5,1,0\n",
            "line 2: neither concurrency",
        ),
        ("prompt_tokens,output_tokens,ttft_ms,tpot_ms,concurrency,tp\n10,10,5,1,2,x\n", "tp 'x' is not"),
        ("prompt_tokens,output_tokens,ttft_ms,tpot_ms,concurrency\n", "no runs"),
    ],
)
def test_bad_measurements_are_one_line_naming_file_and_problem(
    content: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.data"
    path.write_text(content)
    with pytest.raises(MeasurementError, match=problem):
        read_measurements([path])
    rc = exit_code(["twin", "calibrate", "--measurements", str(path), "--out", str(tmp_path / "p.yaml")])
    err = capsys.readouterr().err
    assert rc == EXIT_FAILURE
    assert err.startswith(f"disagg twin calibrate: {path}") and problem in err and err.count("\n") == 1
    assert not (tmp_path / "p.yaml").exists()


def test_a_missing_file_is_a_failure_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = exit_code(["twin", "calibrate", "--measurements", str(tmp_path / "no.json"), "--out", "-"])
    assert rc == EXIT_FAILURE and f"{tmp_path / 'no.json'}: cannot read" in capsys.readouterr().err


def test_an_unknown_model_without_its_config_says_what_exists_and_how_to_add_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "runs.csv"
    path.write_text(
        "model,gpu,tp,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms\nacme/x-9b,h100,1,1,10,10,5,1\n"
    )
    assert exit_code(["twin", "calibrate", "--measurements", str(path), "--out", "-"]) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert "no twin profile for model 'acme/x-9b'" in err and "--model-config" in err
    assert "llama-3.1-8b on a100 TP1/2/4/8 bf16; h100" in err and err.count("\n") == 1


def test_calibrate_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert exit_code(["twin", "calibrate", "--help"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "--measurements" in out and "--holdout" in out and "0  success" in out and "2  usage" in out
    assert exit_code(["twin", "calibrate", "--out", "-"]) == EXIT_USAGE  # --measurements is required


# --- the fit --------------------------------------------------------------------------------------------
def _point(
    c: int | None, isl: int, osl: int, rate: float | None = None, model: str = "llama-3.1-8b"
) -> MeasuredPoint:
    # "burst": a closed loop's clients all start at once (the first round counts, as vLLM's client does)
    setup = Setup(model, "h100", 1, "bf16", None, c, rate, isl, osl, None, start="burst")
    return MeasuredPoint(setup, Observed(1.0, 1.0), f"{isl}/{c or rate}")


GRID = [_point(c, isl, 128) for c in (1, 8, 24) for isl in (512, 3000)] + [_point(None, 1024, 128, rate=3.0)]


def _measured_by_twin(points: list[MeasuredPoint], knobs: dict[str, float]) -> list[MeasuredPoint]:
    """What the twin predicts under ``knobs``, written down as if a benchmark had measured it. A closed
    loop's clients spread over the measured duration of a request, so the prediction is repeated until the
    duration it reads is the one it writes (the dummy observation's 1 s per token would spread them over
    minutes)."""
    plan = fit_measured.plan(points)
    (target,) = plan.targets.values()
    for _ in range(3):
        errs = fit_measured.evaluate(target, plan, knobs, points)
        points = [replace(e.point, observed=Observed(e.ttft_s, e.tpot_s)) for e in errs]
    return points


def test_the_fit_recovers_perturbed_knobs_and_predicts_held_out_runs_better() -> None:
    start = fit_measured.plan(GRID).targets[KEY_8B].start
    truth = {
        "overhead_factor": start["overhead_factor"] * 1.3,
        "step_overhead_ms": start["step_overhead_ms"] * 2.5,
        "request_overhead_ms": start["request_overhead_ms"] * 0.4,
    }
    measured = _measured_by_twin(GRID, truth)
    held = "3,7"  # a closed-loop run and the Poisson one: predicted by the fit to the other five
    plan = fit_measured.plan(measured)
    report = fit_measured.fit_target(plan.targets[KEY_8B], plan, holdout=held)
    for name, value in truth.items():
        assert report.knobs[name] == pytest.approx(value, rel=0.05), name
    fit_ttft, fit_tpot = fit_measured.mean_abs(report.fitted)
    held_ttft, held_tpot = fit_measured.mean_abs(report.held_out)
    assert len(report.held_out) == 2 and max(fit_ttft, fit_tpot, held_ttft, held_tpot) < 0.03
    unfitted = {e.point.source: e for e in report.baseline}
    for e in report.held_out:  # the shipped (unperturbed) profile misses the held-out runs by more
        before = unfitted[e.point.source]
        assert abs(e.ttft_err) < abs(before.ttft_err) and abs(e.tpot_err) < abs(before.tpot_err)
    assert min(fit_measured.mean_abs(report.baseline)) > 0.1


def test_leave_one_out_predicts_every_run_from_the_others() -> None:
    start = fit_measured.plan(GRID[:4]).targets[KEY_8B].start
    truth = dict(start, overhead_factor=start["overhead_factor"] * 0.8)
    measured = _measured_by_twin(GRID[:4], truth)
    plan = fit_measured.plan(measured)
    report = fit_measured.fit_target(plan.targets[KEY_8B], plan, holdout="loo")
    assert [e.point.source for e in report.held_out] == [p.source for p in measured]
    assert report.knobs["overhead_factor"] == pytest.approx(truth["overhead_factor"], rel=0.05)
    assert max(fit_measured.mean_abs(report.held_out)) < max(fit_measured.mean_abs(report.baseline))


@pytest.mark.parametrize(
    ("spec", "problem"), [("0", "within 1..4"), ("x", "not 'loo'"), ("1,2,3,4", "every run")]
)
def test_a_bad_holdout_is_refused(spec: str, problem: str) -> None:
    with pytest.raises(fit_measured.FitError, match=problem):
        fit_measured.holdout_split(4, spec)


def test_roofline_tables_scale_as_the_architecture_says() -> None:
    from disagg.perf.latency import load_gpu_spec, load_model_config

    grid = load_profile_yaml("coefficients.yaml")["m_grid"]
    mc, gs = load_model_config("llama-3.1-70b"), load_gpu_spec("h100")
    tp1 = fit_measured.roofline_entry(mc, gs, 1, "bf16", grid)
    tp4 = fit_measured.roofline_entry(mc, gs, 4, "bf16", grid)
    fp8 = fit_measured.roofline_entry(mc, gs, 1, "fp8", grid)
    # one token reads every weight once: 2 bytes a parameter over HBM (~70B params less embeddings)
    assert tp1["layers_ms"][0] == pytest.approx(1000 * 2 * 68.5e9 / 3.35e12, rel=0.05)
    assert tp1["layers_ms"][-1] / tp1["layers_ms"][-2] == pytest.approx(2, rel=0.01)  # compute-bound: linear
    assert (
        tp4["layers_ms"][-1] < tp1["layers_ms"][-1] / 3.5 and fp8["layers_ms"][0] < tp1["layers_ms"][0] * 0.51
    )
    assert tp1["gen_attn_ms"][1] == pytest.approx(1000 * mc.kv_bytes_per_token() / 3.35e12)
    assert tp4["allreduce_ms"][0] > 0 == tp1["allreduce_ms"][0]


# --- the profile file and disagg simulate --profile -----------------------------------------------------
def test_an_unknown_model_is_calibrated_from_its_config_and_simulated_with_the_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN_CONFIG))
    runs = tmp_path / "runs.csv"
    runs.write_text(
        "model,gpu,tp,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms\n"
        "Qwen/Qwen2.5-7B-Instruct,h100,1,1,1000,100,60,9.5\n"
        "Qwen/Qwen2.5-7B-Instruct,h100,1,16,1000,100,240,14\n"
        "Qwen/Qwen2.5-7B-Instruct,h100,1,4,4000,100,300,11\n"
    )
    out = tmp_path / "profile.yaml"
    argv = [
        "twin",
        "calibrate",
        "--measurements",
        str(runs),
        "--model-config",
        str(config),
        "--out",
        str(out),
    ]
    assert exit_code(argv) == EXIT_OK
    printed = capsys.readouterr().out
    assert "qwen2.5-7b-instruct/h100/tp1/bf16 (roofline kernel tables, 3 runs)" in printed
    assert "held-out error ( 3 runs)" in printed and "fit error" in printed
    doc = yaml.safe_load(out.read_text())
    model = doc["models"]["qwen2.5-7b-instruct"]
    assert (model["layers"], model["kv_heads"], model["head_dim"], model["aliases"]) == (
        28,
        4,
        128,
        ["Qwen/Qwen2.5-7B-Instruct"],
    )
    assert 7.0 < model["params_b"] < 8.0  # Qwen2.5-7B has 7.6B parameters (its model card)
    entry = doc["profiles"]["qwen2.5-7b-instruct/h100/tp1/bf16"]
    assert set(fit_measured.PARAMS) <= entry.keys() and entry["calibration"]["points"] == 3
    assert set(load_profile_yaml("models.yaml")["models"]).isdisjoint(doc["models"])  # shipped untouched

    dep = tmp_path / "dep.yaml"
    dep.write_text(
        "model: Qwen/Qwen2.5-7B-Instruct\nprefill: {replicas: 1, tp: 1}\ndecode: {replicas: 1, tp: 1}\n"
    )
    sim = [
        "simulate",
        "--deployment",
        str(dep),
        "--traffic",
        "poisson",
        "--rate",
        "2",
        "--duration",
        "30",
        "--quiet",
    ]
    assert exit_code(sim) == EXIT_USAGE  # without the profile the twin does not know the model
    assert "no twin profile for model 'Qwen/Qwen2.5-7B-Instruct'" in capsys.readouterr().err
    assert exit_code([*sim, "--profile", str(out)]) == EXIT_OK
    captured = capsys.readouterr()
    assert "note: profile" in captured.err and " P/D" in captured.out


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("kind: other\n", "not a profile written by disagg twin calibrate"),
        ("kind: disagg-twin-profile\nm_grid: [1, 2]\n", "m_grid differs"),
        (": : :\n", "cannot read the profile"),
    ],
)
def test_a_bad_profile_is_a_failure_naming_the_file(
    content: str, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(content)
    dep = tmp_path / "dep.yaml"
    dep.write_text("model: llama-3.1-8b\nprefill: {replicas: 1, tp: 1}\ndecode: {replicas: 1, tp: 1}\n")
    argv = ["simulate", "--deployment", str(dep), "--traffic", "poisson", "--profile", str(path), "--quiet"]
    assert exit_code(argv) == EXIT_FAILURE
    err = capsys.readouterr().err
    assert err.startswith(f"disagg simulate: {path}") and problem in err and err.count("\n") == 1


def test_a_profile_entry_replaces_the_shipped_knobs_for_that_run_only() -> None:
    from disagg.perf.latency import load_latency_model

    shipped = load_latency_model("llama-3.1-8b", "h100", 1)
    coef = load_profile_yaml("coefficients.yaml")
    entry = dict(coef["profiles"][KEY_8B], overhead_factor=2.0, step_overhead_ms=7.0, request_overhead_ms=3.0)
    set_profile_overlay({"profiles": {KEY_8B: entry}})
    lm = load_latency_model("llama-3.1-8b", "h100", 1)
    assert (
        lm.overhead_factor == 2.0
        and lm.runtime.step_overhead_s == 0.007
        and lm.runtime.request_overhead_s == 0.003
    )
    set_profile_overlay(None)
    assert load_latency_model("llama-3.1-8b", "h100", 1).runtime == shipped.runtime


def test_a_gpu_the_twin_lacks_takes_its_datasheet_and_scales_the_h100_tables() -> None:
    spec = {
        "product": "ACME-X1",
        "memory_gib": 96,
        "bf16_tflops": 500,
        "fp8_tflops": 1000,
        "hbm_tbps": 2.0,
        "nvlink_gbps": 450,
        "nic_gbit": 200,
    }
    runs = [replace(p, setup=replace(p.setup, gpu="acme-x1")) for p in GRID[:2]]
    with pytest.raises(profiles.ProfileError, match=r"no twin profile for GPU 'acme-x1'.*--gpu-spec"):
        fit_measured.plan(runs)
    with pytest.raises(fit_measured.FitError, match="hbm_tbps must be a number > 0"):
        fit_measured.plan(runs, gpu_spec=dict(spec, hbm_tbps="fast"))
    plan = fit_measured.plan(runs, gpu_spec=spec)
    target = plan.targets["llama-3.1-8b/acme-x1/tp1/bf16"]
    assert target.base_source == "scaled" and plan.gpus == {"acme-x1": spec}
    h100 = load_profile_yaml("coefficients.yaml")["profiles"][KEY_8B]
    # disagg.twin.calibrate.scaled_entry: the slower of the HBM (3.35 / 2.0) and TFLOPS (989 / 500) ratios
    # at small batches, the TFLOPS one at large
    assert target.base["layers_ms"][0] == pytest.approx(h100["layers_ms"][0] * 989 / 500, rel=1e-3)
    assert target.base["gen_attn_ms"][1] == pytest.approx(h100["gen_attn_ms"][1] * 3.35 / 2.0)


EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


@pytest.mark.parametrize(
    ("name", "points"),
    [
        ("calibrate-aiconfigurator-llama70b.csv", fidelity.AICONFIG),
        (
            "calibrate-nim-llama33-70b.csv",
            (
                fidelity.NIM_SINGLE,
                *fidelity.NIM_CONCURRENCY,
                *fidelity.NIM_SATURATED,
                fidelity.NIM_SHORT_PROMPT,
            ),
        ),
    ],
)
def test_the_documented_calibration_examples_are_the_fidelity_points(
    name: str, points: tuple[fidelity.ClosedLoopPoint, ...]
) -> None:
    """docs/simulate.md calibrates on these files; they hold the published points the twin's fidelity
    tests check (disagg.twin.fidelity), the same numbers and the same reading of how each run was counted
    (a whole run from clients starting together, or a steady state), so the two never drift apart."""
    read = read_measurements([EXAMPLES / name])
    got = {
        (
            int(m.setup.prompt_tokens),
            int(m.setup.output_tokens),
            m.setup.concurrency,
            m.setup.tp,
            m.setup.dtype,
        ): (
            m.observed.ttft_mean_s,
            m.observed.tpot_mean_s,
            m.setup.num_requests if m.setup.start == "burst" else None,
        )
        for m in read
    }
    want = {
        (p.isl, p.osl, p.concurrency, p.tp, p.dtype): (p.ttft_s, p.tpot_s, p.num_requests) for p in points
    }
    assert got.keys() == want.keys()
    for key, (ttft, tpot, num_requests) in want.items():
        assert got[key][:2] == pytest.approx((ttft, tpot), rel=1e-9), key
        assert got[key][2] == num_requests, key


@pytest.mark.parametrize(("holdout", "fits"), [("loo", 3), ("2", 1), ("none", 1)])
def test_fit_target_reports_each_fit_it_runs(holdout: str, fits: int) -> None:
    """The CLI's progress bar counts fits: one, plus one per run under leave-one-out."""
    plan = fit_measured.plan([_point(1, 512, 64), _point(1, 3000, 64)])
    (target,) = plan.targets.values()
    calls: list[int] = []
    fit_measured.fit_target(target, plan, holdout, on_fit=lambda: calls.append(1))
    assert fit_measured.fits_needed(target, holdout) == fits == len(calls)
