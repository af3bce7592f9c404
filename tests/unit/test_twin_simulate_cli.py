"""`disagg simulate` as a user meets it: the sample traces shipped in the repository, the commands the
README and docs/simulate.md show (run as written, from the repository root), and ``--traffic``."""

from __future__ import annotations

import html
import itertools
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from disagg.cli import main
from disagg.twin.traffic import detect_format, load_trace

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = ROOT / "examples" / "traces"
SAMPLE_FILES = {
    "azure-conv-sample.csv": ("azure", "LICENSE-CC-BY-4.0"),
    "azure-code-sample.csv": ("azure", "LICENSE-CC-BY-4.0"),
    "mooncake-sample.jsonl": ("mooncake", "LICENSE-APACHE-2.0"),
}
TWIN_DEPLOYMENT = "model: llama-3.1-8b\nprefill: {replicas: 1, tp: 1}\ndecode: {replicas: 1, tp: 1}\n"


@pytest.mark.parametrize("name", sorted(SAMPLE_FILES))
def test_sample_traces_are_small_attributed_and_load(name: str) -> None:
    path = SAMPLES / name
    fmt, licence = SAMPLE_FILES[name]
    assert path.stat().st_size < 100_000
    assert detect_format(path) == fmt
    reqs = load_trace(path)
    assert 300 <= len(reqs) <= 2000
    assert reqs[0].arrival_s == 0.0 and all(a.arrival_s <= b.arrival_s for a, b in itertools.pairwise(reqs))
    assert all(r.prompt_tokens > 0 and r.output_tokens > 0 for r in reqs)
    if fmt == "mooncake":
        assert all(r.prefix_hashes for r in reqs)
    attribution = (SAMPLES / "README.md").read_text()
    assert name in attribution and licence in attribution
    assert (SAMPLES / licence).stat().st_size > 5000  # the licence text itself, not a pointer
    for citation in ("Splitwise", "ISCA 2024", "Mooncake", "FAST 2025"):
        assert citation in attribution


def test_sample_traces_are_not_ignored_by_git() -> None:
    """A fresh clone has them: no .gitignore rule drops the files the README's commands read."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = [
        str(SAMPLES / n) for n in [*SAMPLE_FILES, "README.md", "LICENSE-CC-BY-4.0", "LICENSE-APACHE-2.0"]
    ]
    ignored = subprocess.run(
        [git, "-C", str(ROOT), "check-ignore", *paths], capture_output=True, text=True, check=False
    )
    assert ignored.returncode == 1, f"ignored by git: {ignored.stdout}"


def documented_simulate_commands() -> list[tuple[str, list[str]]]:
    """Every ``disagg simulate`` command in the README's and docs/simulate.md's sh blocks, as argv."""
    found = []
    for doc in (ROOT / "README.md", ROOT / "docs" / "simulate.md"):
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(), flags=re.S):
            for command in block.replace("\\\n", " ").splitlines():
                argv = shlex.split(command, comments=True)
                if argv[:2] == ["disagg", "simulate"]:
                    found.append((f"{doc.name}: {' '.join(argv[2:])[:60]}", argv[1:]))
    return found


COMMANDS = documented_simulate_commands()


def test_the_readme_shows_simulate_commands_on_the_samples() -> None:
    readme = [argv for where, argv in COMMANDS if where.startswith("README.md")]
    assert any("--trace" in argv for argv in readme) and any("--traffic" in argv for argv in readme)
    for _, argv in COMMANDS:
        assert "../shared" not in " ".join(argv)  # only in the developers' checkout, never in a clone


@pytest.mark.parametrize("argv", [argv for _, argv in COMMANDS], ids=[where for where, _ in COMMANDS])
def test_documented_simulate_command_runs_as_written(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from the repository root exactly as documented (only ``--out`` goes to a temporary folder)."""
    monkeypatch.chdir(ROOT)
    args = [
        str(tmp_path / "out") if prev == "--out" else a
        for prev, a in zip(["", *argv[:-1]], argv, strict=True)
    ]
    assert main([*args, "--quiet"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if " P/D" in line]
    assert rows, out
    assert re.search(r"\d+ requests", out)
    if "--out" in argv:
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert all(run["finished"] > 0 for run in summary["runs"])
        assert (tmp_path / "out" / "report.html").stat().st_size > 0


def simulate_traffic(tmp_path: Path, *flags: str) -> tuple[int, dict[str, object]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    dep = tmp_path / "dep.yaml"
    dep.write_text(TWIN_DEPLOYMENT)
    out = tmp_path / "out"
    rc = main(["simulate", "--deployment", str(dep), "--out", str(out), "--quiet", *flags])
    summary = json.loads((out / "summary.json").read_text()) if rc == 0 else {}
    return rc, summary


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--traffic", "poisson", "--rate", "2", "--duration", "120"], (180, 300)),
        (["--traffic", "bursty", "--rate", "2", "--cv", "4", "--duration", "120"], (60, 480)),
        (["--traffic", "diurnal", "--rate", "2", "--amplitude", "0.8", "--duration", "120"], (160, 320)),
        (["--traffic", "phase-change", "--rate", "2", "--duration", "120"], (100, 200)),
    ],
    ids=["poisson", "bursty", "diurnal", "phase-change"],
)
def test_traffic_kinds_generate_their_rate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], expected: tuple[int, int]
) -> None:
    rc, summary = simulate_traffic(tmp_path, *flags)
    assert rc == 0
    (run,) = summary["runs"]  # type: ignore[misc]
    assert expected[0] <= run["requests"] <= expected[1]
    assert summary["trace"] is None and str(summary["traffic"]).startswith(flags[1])
    assert f"{run['requests']} requests" in capsys.readouterr().out


def test_traffic_is_reproducible_for_a_seed_and_differs_across_seeds(tmp_path: Path) -> None:
    flags = ["--traffic", "bursty", "--rate", "3", "--duration", "60"]
    first = simulate_traffic(tmp_path / "a", *flags, "--seed", "4")[1]["runs"]
    again = simulate_traffic(tmp_path / "b", *flags, "--seed", "4")[1]["runs"]
    other = simulate_traffic(tmp_path / "c", *flags, "--seed", "5")[1]["runs"]
    assert first == again
    assert first != other


def test_phase_change_phases_set_rate_and_lengths(tmp_path: Path) -> None:
    """Two phases: 60 s of short prompts at 4 req/s, then 60 s of 6000-token prompts at 1 req/s."""
    from disagg.twin.traffic_args import PhaseArg, generate

    class Args:
        traffic = "phase-change"
        phases = [PhaseArg(60, 4), PhaseArg(60, 1, 6000, 100)]
        duration = rate = cv = amplitude = period = None
        prompt_mean = prompt_cv = output_mean = output_cv = None
        seed = 0

    reqs, described = generate(Args())  # type: ignore[arg-type]
    first = [r for r in reqs if r.arrival_s < 60]
    second = [r for r in reqs if r.arrival_s >= 60]
    assert 180 <= len(first) <= 300 and 35 <= len(second) <= 90
    assert np.mean([r.prompt_tokens for r in second]) > 3 * np.mean([r.prompt_tokens for r in first])
    assert "60 s at 4 req/s" in described and "prompt 6000" in described


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--trace", str(SAMPLES / "azure-conv-sample.csv"), "--rate", "3"], "--rate: only with --traffic"),
        (["--traffic", "diurnal", "--cv", "2"], "--cv: not read by diurnal"),
        (["--traffic", "poisson", "--phase", "60:2"], "--phase: not read by poisson"),
        (["--traffic", "phase-change", "--phase", "60:2", "--rate", "3"], "--rate: each --phase sets"),
        (["--traffic", "phase-change", "--phase", "60:2", "--duration", "30"], "--duration: each --phase"),
        (["--traffic", "poisson", "--rate", "0.001", "--duration", "1"], "no request arrived"),
    ],
)
def test_traffic_flags_that_would_be_ignored_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    dep = tmp_path / "dep.yaml"
    dep.write_text(TWIN_DEPLOYMENT)
    assert main(["simulate", "--deployment", str(dep), "--quiet", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


@pytest.mark.parametrize(
    "flags",
    [
        [],  # neither --trace nor --traffic
        ["--trace", str(SAMPLES / "azure-conv-sample.csv"), "--traffic", "poisson"],
        ["--traffic", "weekly"],
        ["--traffic", "diurnal", "--amplitude", "1"],
        ["--traffic", "phase-change", "--phase", "60"],
        ["--traffic", "phase-change", "--phase", "60:-1"],
    ],
    ids=["no-source", "both", "unknown-kind", "amplitude-1", "phase-no-rate", "phase-negative"],
)
def test_traffic_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str]) -> None:
    dep = tmp_path / "dep.yaml"
    dep.write_text(TWIN_DEPLOYMENT)
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--deployment", str(dep), "--quiet", *flags])
    assert exit_info.value.code == 2
    assert "error:" in capsys.readouterr().err


# --- profiles: an unknown model or GPU is one line, a defaulted GPU is said ------------------------------
DD = ROOT / "examples" / "vllm-nixl.yaml"
H100_SELECTOR = "nodeSelector: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3}"


def simulate_deployment(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> tuple[int, str, dict[str, object]]:
    dep = tmp_path / "dep.yaml"
    dep.write_text(text)
    out = tmp_path / "out"
    trace = str(SAMPLES / "azure-conv-sample.csv")
    rc = main(["simulate", "--trace", trace, "--duration", "30", "--deployment", str(dep), "--out", str(out)])
    err = capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text()) if rc == 0 else {}
    return rc, err, summary


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("model: mistral-7b\nprefill: {replicas: 1}\ndecode: {replicas: 1}\n", "model 'mistral-7b'"),
        (DD.read_text().replace("NVIDIA-H100-80GB-HBM3", "NVIDIA-GB300"), "GPU 'NVIDIA-GB300'"),
        (
            "model: llama-3.1-70b\ngpu: h200\nprefill: {replicas: 1, tp: 2}\ndecode: {replicas: 1, tp: 8}\n",
            "llama-3.1-70b on h200 at TP2 bf16 (prefill pool)",
        ),
    ],
    ids=["model", "gpu", "tp"],
)
def test_a_missing_profile_is_one_line_listing_the_profiles_and_how_to_add_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, named: str
) -> None:
    rc, err, _ = simulate_deployment(tmp_path, capsys, text)
    assert rc == 2
    (line,) = [x for x in err.splitlines() if x.strip()]
    assert line.startswith("disagg simulate: no twin profile for ") and named in line
    for exists in ("llama-3.1-70b on a100 TP4/8 bf16", "h100 TP4/8 bf16+fp8", "llama-3.1-8b on"):
        assert exists in line
    assert "models.yaml" in line and "gpus.yaml" in line and "python -m disagg.twin.calibrate" in line


def test_a_deployment_without_a_gpu_selector_says_which_gpu_it_simulates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = DD.read_text()
    assert text.count(H100_SELECTOR) == 2
    rc, err, summary = simulate_deployment(tmp_path, capsys, text.replace(H100_SELECTOR, ""))
    assert rc == 0
    notes = [line for line in err.splitlines() if "note:" in line]
    assert len(notes) == 1
    assert "no pool's nodeSelector names a GPU type" in notes[0] and "default h100" in notes[0]
    assert summary["notes"] == [notes[0].split("note: ", 1)[1]]


def test_a_deployment_with_a_gpu_selector_has_no_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err, summary = simulate_deployment(tmp_path, capsys, DD.read_text())
    assert rc == 0 and "note:" not in err and summary["notes"] == []
    # one GPU named two ways (the product label and the twin's name) is one GPU
    text = DD.read_text().replace(H100_SELECTOR, "nodeSelector: {disagg.dev/gpu-type: h100}", 1)
    rc, err, _ = simulate_deployment(tmp_path, capsys, text)
    assert rc == 0 and "note:" not in err


def test_pools_on_different_gpus_say_which_one_is_simulated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = DD.read_text().replace(H100_SELECTOR, "nodeSelector: {disagg.dev/gpu-type: a100}", 1)
    rc, err, _ = simulate_deployment(tmp_path, capsys, text)
    assert rc == 0
    assert "prefill a100, decode NVIDIA-H100-80GB-HBM3" in err and "simulates both pools on" in err


def test_a_twin_document_without_gpu_says_it_uses_the_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, err, summary = simulate_deployment(tmp_path, capsys, TWIN_DEPLOYMENT)
    assert rc == 0 and "no gpu field; simulating the default h100" in err
    assert summary["notes"] == [
        "twin: no gpu field; simulating the default h100 (set gpu: to simulate another)"
    ]
    rc, err, _ = simulate_deployment(tmp_path, capsys, TWIN_DEPLOYMENT + "gpu: h100\n")
    assert rc == 0 and "note:" not in err


def test_gpu_note_is_not_a_field_a_document_sets(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, err, _ = simulate_deployment(tmp_path, capsys, TWIN_DEPLOYMENT + "gpu_note: hello\n")
    assert rc == 2 and "unknown field(s) gpu_note" in err


# --- decisions and bounds: each cause counted, a pool pinned at its maxReplicas while the SLO is missed ---
def test_simulate_counts_decision_causes_and_warns_when_a_pool_sits_at_its_max(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Long Mooncake prompts on the 70B example with the chat policy: prefill climbs to its maxReplicas
    (4) and stays there while almost no request meets the 1 s TTFT target; the summary says so."""
    out = tmp_path / "out"
    argv = ["simulate", "--trace", str(SAMPLES / "mooncake-sample.jsonl"), "--deployment", str(DD)]
    argv += ["--policy", str(ROOT / "policies" / "chat.yaml"), "--out", str(out), "--quiet"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    (counts,) = [line for line in stdout.splitlines() if line.startswith("decisions: ")]
    summary = json.loads((out / "summary.json").read_text())
    decisions = summary["decisions"]
    assert counts.startswith(f"decisions: {len(decisions)} evaluations")
    for cause in {d["cause"] for d in decisions}:
        n = sum(d["cause"] == cause for d in decisions)
        assert f"{cause} {n}" in counts
    assert all(d["reasons"] and d["reasons"][0]["code"] == d["cause"] for d in decisions)
    warnings = [line for line in stdout.splitlines() if line.startswith("warning: prefill maxReplicas (4)")]
    assert warnings and "while the SLO was missed" in warnings[0]
    assert warnings[0] in [f"warning: {f.split('warning: ', 1)[-1]}" for f in summary["findings"]]
    assert summary["runs"][0]["gpus"] == 24  # 4 x TP4 prefill + 1 x TP8 decode at the peak
    page = (out / "report.html").read_text()
    assert "Notes, decisions and bounds" in page and html.escape(warnings[0]) in page


def test_no_bound_warning_when_the_slo_is_met(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["simulate", "--trace", str(SAMPLES / "azure-conv-sample.csv"), "--duration", "120"]
    argv += ["--deployment", str(DD), "--policy", str(ROOT / "policies" / "chat.yaml"), "--quiet"]
    assert main(argv) == 0
    stdout = capsys.readouterr().out
    assert "decisions: " in stdout and "warning:" not in stdout
