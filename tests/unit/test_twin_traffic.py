"""Trace loaders (small samples written here) and generators of the twin."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from disagg.twin.traffic import (
    DOCS,
    Phase,
    chat_to_documents,
    detect_format,
    diurnal,
    gamma_bursty,
    load_trace,
    phase_change,
    poisson,
    scale_rate,
)

AZURE = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2000000,879,1
"""
MOONCAKE = """{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]}
{"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 52]}

{"timestamp": 27000, "input_length": 100, "output_length": 5, "hash_ids": []}
"""
BURSTGPT = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,GPT-4,1087,0,1087,Conversation log
118,ChatGPT,417,251,668,API log
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_azure_csv(tmp_path: Path) -> None:
    reqs = load_trace(write(tmp_path, "a.csv", AZURE))
    assert [(r.prompt_tokens, r.output_tokens) for r in reqs] == [(374, 44), (396, 109), (879, 1)]
    assert reqs[0].arrival_s == 0.0
    assert reqs[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)


def test_azure_times_do_not_depend_on_the_machines_time_zone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 01:59:59 and 02:00:01 on 2023-11-05 are 3602 s apart in Los Angeles local time (it falls back at 02:00)
    trace = write(
        tmp_path,
        "dst.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-05 01:59:59.0000000,10,1\n2023-11-05 02:00:01.0000000,10,1\n",
    )
    gaps: dict[str, list[float]] = {}
    try:
        for zone in ("UTC", "America/Los_Angeles"):
            monkeypatch.setenv("TZ", zone)
            time.tzset()
            gaps[zone] = [r.arrival_s for r in load_trace(trace)]
    finally:
        monkeypatch.undo()
        time.tzset()
    assert gaps["UTC"] == gaps["America/Los_Angeles"] == [0.0, 2.0]


def test_mooncake_jsonl_sorted_relative_milliseconds(tmp_path: Path) -> None:
    reqs = load_trace(write(tmp_path, "m.jsonl", MOONCAKE))
    assert [r.prompt_tokens for r in reqs] == [100, 6955, 6472]
    assert [r.arrival_s for r in reqs] == pytest.approx([0.0, 0.482, 3.535])


def test_burstgpt_skips_failed_requests(tmp_path: Path) -> None:
    reqs = load_trace(write(tmp_path, "b.csv", BURSTGPT))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 472, 18),
        (113.0, 417, 251),
    ]


def test_unknown_format_and_bad_rows_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^trace: cannot tell"):
        detect_format(write(tmp_path, "x.csv", "a,b,c\n1,2,3\n"))
    with pytest.raises(ValueError, match=r"a\.csv:3: bad Azure trace row"):
        load_trace(write(tmp_path, "a.csv", AZURE.replace("396", "many")))
    with pytest.raises(ValueError, match=r"^trace:"):
        load_trace(tmp_path / "missing.csv")


def test_shared_traces_load_when_present() -> None:
    root = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
    conv = root / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    if not conv.is_file():
        pytest.skip("shared traces not present")
    reqs = load_trace(conv)
    assert len(reqs) == 19366  # row count of the file (../shared/README.md)
    assert np.mean([r.prompt_tokens for r in reqs]) == pytest.approx(1155, rel=0.01)


def cv(reqs: list) -> float:
    gaps = np.diff([r.arrival_s for r in reqs])
    return float(np.std(gaps) / np.mean(gaps))


def _rate(reqs: list) -> float:
    return len(reqs) / reqs[-1].arrival_s


def test_generators_hit_their_rates_and_burstiness() -> None:
    p = poisson(10.0, 600.0, seed=1)
    g = gamma_bursty(10.0, 600.0, cv=4.0, seed=1)
    assert _rate(p) == pytest.approx(10.0, rel=0.1)
    assert _rate(g) == pytest.approx(10.0, rel=0.35)
    assert cv(p) == pytest.approx(1.0, abs=0.15)
    assert cv(g) > 2.5
    assert poisson(10.0, 60.0, seed=5) == poisson(10.0, 60.0, seed=5)


def test_diurnal_peaks_and_troughs() -> None:
    reqs = diurnal(5.0, 1000.0, period_s=1000.0, amplitude=0.8, seed=2)
    t = np.array([r.arrival_s for r in reqs])
    assert np.sum(t < 500) > 2 * np.sum(t >= 500)  # sin > 0 in the first half period


def test_phase_change_turns_chat_into_documents() -> None:
    reqs = chat_to_documents(8.0, 300.0, seed=4)
    first = [r.prompt_tokens for r in reqs if r.arrival_s < 300]
    second = [r.prompt_tokens for r in reqs if r.arrival_s >= 300]
    assert np.mean(second) > 4 * np.mean(first)
    custom = phase_change([Phase(100, 1.0), Phase(100, 1.0, DOCS)], seed=1)
    assert all(0 <= r.arrival_s < 200 for r in custom)


def test_rate_scaling_compresses_time() -> None:
    reqs = poisson(2.0, 300.0, seed=9)
    fast = scale_rate(reqs, 4.0)
    assert fast[-1].arrival_s == pytest.approx(reqs[-1].arrival_s / 4)
    assert [r.prompt_tokens for r in fast] == [r.prompt_tokens for r in reqs]


def test_synthetic_prompts_have_the_asked_length_and_share_no_prefix() -> None:
    from disagg.twin.live.load import synthetic_prompt

    prompts = [synthetic_prompt(64, i) for i in range(50)]
    assert all(len(p) == 64 for p in prompts)
    assert len({p[0] for p in prompts}) == 50  # a cache-aware router sees 50 different prefixes
