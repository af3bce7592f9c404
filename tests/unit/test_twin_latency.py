"""The latency model (disagg.perf, shared by the policy and the twin): contract, physics, error messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from disagg.perf.latency import PROFILES_DIR, Link, load_latency_model


def test_kv_bytes_per_token_from_config() -> None:
    # 2 (K,V) * 80 layers * 8 kv heads * 128 head_dim * 2 bytes (Llama-3.1-70B config.json)
    assert load_latency_model("llama-3.1-70b", "h100", 4).kv_bytes_per_token == 327680
    assert load_latency_model("llama-3.1-8b", "h100", 1).kv_bytes_per_token == 131072


def test_kv_capacity_is_vllms_budget_in_whole_blocks() -> None:
    m = load_latency_model("llama-3.1-70b", "h100", 4)
    b = m.kv_budget
    # vLLM: requested - weights - activation peak - CUDA graphs, in whole 16-token blocks of 1/4 of the heads
    assert b.available == b.requested - b.weights - b.activation - b.cudagraph and b.other == 0
    assert b.weights == 70.6e9 * 2 / 4
    assert m.kv_capacity_tokens == int(b.available // (16 * 327680 / 4)) * 16
    # More GPUs in the TP group leave more room for KV per replica.
    assert load_latency_model("llama-3.1-70b", "h100", 8).kv_capacity_tokens > m.kv_capacity_tokens


def test_prefill_grows_with_length_and_decode_with_batch_and_context() -> None:
    m = load_latency_model("llama-3.1-70b", "h100", 8, "fp8")
    t1k, t8k = m.prefill_time_s([1024]), m.prefill_time_s([8192])
    assert 6 * t1k < t8k < 16 * t1k  # compute-bound GEMMs plus quadratic attention
    assert (
        m.decode_step_time_s(64, 64 * 2048) > m.decode_step_time_s(8, 8 * 2048) > m.decode_step_time_s(8, 8)
    )


def test_decode_jump_equals_sum_of_steps() -> None:
    m = load_latency_model("llama-3.1-8b", "h100", 1)
    batch, ctx, k = 16, 16 * 700, 37
    stepwise = sum(m.decode_step_time_s(batch, ctx + batch * i) for i in range(k))
    assert m.decode_steps_time_s(batch, ctx, k) == pytest.approx(stepwise, rel=1e-9)


def test_mixed_step_costs_more_than_its_parts_alone_minus_overhead() -> None:
    m = load_latency_model("llama-3.1-8b", "h100", 1)
    mixed = m.mixed_step_time_s(512, 32, 32 * 1000)
    assert mixed > m.decode_step_time_s(32, 32 * 1000)
    assert mixed > m.prefill_time_s([512])


def test_kv_transfer_is_setup_plus_bytes_over_bandwidth() -> None:
    m = load_latency_model("llama-3.1-70b", "h100", 4)
    link = Link("test", 50e9, 0.001)
    assert m.kv_transfer_time_s(1000, link) == pytest.approx(0.001 + 1000 * 327680 / 50e9)
    assert m.kv_transfer_time_s(8192, "nvlink") < m.kv_transfer_time_s(8192, "nic")


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("no-such-model", "h100", 1), "model"),
        (("llama-3.1-8b", "tpu", 1), "gpu"),
        (("llama-3.1-70b", "h100", 1), "tp/dtype"),
        (("llama-3.1-8b", "h100", 1, "int3"), "dtype"),
    ],
)
def test_bad_profile_names_the_field(args: tuple[object, ...], field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}"):
        load_latency_model(*args)


def test_aliases_resolve_hugging_face_ids() -> None:
    m = load_latency_model("meta-llama/Llama-3.3-70B-Instruct", "NVIDIA-H100-80GB-HBM3", 2, "fp8")
    assert m.model.name == "llama-3.1-70b" and m.gpu.name == "h100"


def test_second_and_third_gpu_types_are_slower_than_h100() -> None:
    h100 = load_latency_model("llama-3.1-8b", "h100", 1)
    for other in ("a100", "l40s"):
        m = load_latency_model("llama-3.1-8b", other, 1)
        assert m.prefill_time_s([4096]) > h100.prefill_time_s([4096])
        assert m.decode_step_time_s(32, 32 * 2000) > h100.decode_step_time_s(32, 32 * 2000)
        assert "DATASHEET RATIO" in m.source or "vidur" in m.source
    # A100 (80 GB) holds more KV than L40S (48 GB) for the same model.
    assert (
        load_latency_model("llama-3.1-8b", "a100", 1).kv_capacity_tokens
        > load_latency_model("llama-3.1-8b", "l40s", 1).kv_capacity_tokens
    )


def test_shipped_coefficients_are_reproducible_from_the_calibration_data(tmp_path: Path) -> None:
    from disagg.twin.calibrate import main as calibrate_main

    shared = Path(__file__).resolve().parents[2] / ".." / "shared" / "calibration"
    if not (shared / "aiconfigurator").is_dir():
        pytest.skip("../shared/calibration not present")
    out = tmp_path / "coefficients.yaml"
    assert calibrate_main(["--calibration", str(shared), "--out", str(out)]) == 0
    shipped = PROFILES_DIR / "coefficients.yaml"
    # equal but for rounding: the least-squares fits come out differently with another numpy/BLAS build or
    # CPU (seen: 8.897082467543456e-06 vs 8.897082466319262e-06; the H200 decode fit is ill-conditioned, a
    # QR solve instead of LAPACK's SVD moves it by 9e-10 relative), which is not a different calibration
    assert_close(yaml.safe_load(out.read_text()), yaml.safe_load(shipped.read_text()), "coefficients")


# Tables calibrate.py rounds to 5 decimals: a fit that differs in its last bits may round the other way
ROUNDED_5 = frozenset({"layers_ms", "allreduce_ms", "lm_head_ms"})


def assert_close(got: object, want: object, path: str, rounded: bool = False) -> None:
    """Equal structure and strings; numbers equal to a relative 1e-6 (a changed table or method moves them
    by percents), or to one unit of the last decimal kept where calibrate.py rounds (``rounded``)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), path
        for key in want:
            assert_close(got[key], want[key], f"{path}.{key}", key in ROUNDED_5)
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{path}[{i}]", rounded)
    elif isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-6, abs=1.0001e-5 if rounded else 1e-15), path
    else:
        assert got == want, path


def test_h200_profile_is_measured_and_holds_more_kv_than_h100() -> None:
    h200 = load_latency_model("llama-3.1-8b", "NVIDIA-H200", 1)
    h100 = load_latency_model("llama-3.1-8b", "h100", 1)
    assert h200.gpu.name == "h200" and "MEASURED" in h200.source and h200.overhead_factor == 1.0
    # 141 GB against 80 GB: more than twice the KV after the same 16 GB of weights.
    assert h200.kv_capacity_tokens > 2 * h100.kv_capacity_tokens
    # Reading 256 x 8192 tokens of KV is HBM-bound: the 4.8 TB/s part is faster.
    assert h200.decode_step_time_s(256, 256 * 8192) < h100.decode_step_time_s(256, 256 * 8192)
    # Only the measured shapes exist; the error lists them.
    with pytest.raises(ValueError, match=r"^tp/dtype: .*llama-3.1-8b/h200/tp1/bf16"):
        load_latency_model("llama-3.1-8b", "h200", 2)


def test_fp8_kv_cache_halves_kv_bytes_and_uses_the_fp8_attention_tables() -> None:
    bf16 = load_latency_model("llama-3.1-70b", "h100", 2, "fp8")
    fp8 = load_latency_model("llama-3.1-70b", "h100", 2, "fp8", kv_dtype="fp8")
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token
    # whole 16-token blocks: twice the blocks of half the bytes, or one block more
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, abs=16)
    assert fp8.kv_transfer_time_s(8192) < bf16.kv_transfer_time_s(8192)
    # decode attention over 64 x 8k tokens reads half the bytes: the measured fp8-KV kernel is faster
    assert fp8.decode_step_time_s(64, 64 * 8192) < bf16.decode_step_time_s(64, 64 * 8192)
    with pytest.raises(ValueError, match=r"^kv_dtype"):
        load_latency_model("llama-3.1-8b", "h100", 1, kv_dtype="int4")
    with pytest.raises(ValueError, match=r"^kv_dtype: no FP8"):
        load_latency_model("llama-3.1-8b", "h200", 1, kv_dtype="fp8")
