"""Measured serving runs a user already has, read into typed points for ``disagg twin calibrate``.

Three formats, detected from the content (:func:`read_measurements`):

* vLLM's serving benchmark result (``vllm bench serve --save-result`` / ``benchmarks/benchmark_serving.py
  --save-result``): one JSON object per run, or a JSON list / JSON Lines of them.
* An AIPerf aggregate export (``profile_export_aiperf.json``) or a GenAI-Perf one
  (``profile_export_genai_perf.json``): metrics as ``{"unit": "ms", "avg": .., "p50": ..}`` objects and the
  run's settings under ``input_config``.
* A plain CSV, one run per row: ``model,gpu,tp,concurrency,prompt_tokens,output_tokens,ttft_ms,tpot_ms``
  (``rate`` instead of or beside ``concurrency``; optional ``dtype``, ``kv_dtype``, ``ttft_median_ms``,
  ``itl_ms``, ``num_requests``, and ``start``: ``steady`` (default) or ``burst``, see :class:`Setup`).

None of these says which GPU, TP size or dtype served the run unless the user put it there (vLLM's
``--metadata gpu=h100 tp=2 dtype=fp8`` lands as top-level keys, which are read); what is missing comes from
the command line (:class:`Defaults`). A file that cannot be read is a :class:`MeasurementError` naming the
file and the problem in one line. Pure: reads the named files, nothing else.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from disagg.clicommon import is_stdout

MAX_BYTES = 64 * 2**20  # a detailed vLLM result of tens of thousands of requests stays well under this


class MeasurementError(ValueError):
    """A measurements file that cannot be read, or a run in it that lacks what the fit needs."""


@dataclass(frozen=True)
class Setup:
    """What was served and how it was loaded: one closed loop (``concurrency`` requests in flight) or an
    open loop (``rate`` requests/s, Poisson) of requests with these mean lengths on one colocated replica."""

    model: str
    gpu: str | None
    tp: int | None
    dtype: str | None
    kv_dtype: str | None
    concurrency: int | None
    rate: float | None
    prompt_tokens: float
    output_tokens: float
    num_requests: int | None
    # a closed loop's clients: "burst" (all start at once and every request counts: vLLM's
    # --max-concurrency, AIPerf's --concurrency) or "steady" (desynchronised clients, the first third of
    # the requests discarded: a steady-state figure, as published tables usually are)
    start: str = "steady"


START_MODES = ("burst", "steady")


@dataclass(frozen=True)
class Observed:
    """What the benchmark measured, in seconds: mean TTFT, its median where reported, mean time per
    output token after the first (vLLM's TPOT; the mean inter-token latency where TPOT is not reported)."""

    ttft_mean_s: float
    tpot_mean_s: float
    ttft_median_s: float | None = None


@dataclass(frozen=True)
class MeasuredPoint:
    setup: Setup
    observed: Observed
    source: str  # file and position, e.g. "runs.csv row 3"

    @property
    def label(self) -> str:
        s = self.setup
        load = f"@{s.concurrency}" if s.concurrency is not None else f"@{s.rate:g}/s"
        return f"{s.prompt_tokens:.0f}in/{s.output_tokens:.0f}out {load}"


@dataclass(frozen=True)
class Defaults:
    """What the command line supplies where a file does not say (``--model``, ``--gpu``, ``--tp``, ...);
    a file's own values win."""

    model: str | None = None
    gpu: str | None = None
    tp: int | None = None
    dtype: str | None = None
    kv_dtype: str | None = None


def apply_defaults(point: MeasuredPoint, defaults: Defaults) -> MeasuredPoint:
    s = point.setup
    setup = replace(
        s,
        model=s.model or defaults.model or "",
        gpu=s.gpu or defaults.gpu,
        tp=s.tp or defaults.tp,
        dtype=s.dtype or defaults.dtype,
        kv_dtype=s.kv_dtype or defaults.kv_dtype,
    )
    return replace(point, setup=setup)


# --- helpers -------------------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    if is_stdout(path):
        return sys.stdin.read()
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_BYTES + 1)
    except OSError as error:
        raise MeasurementError(f"{path}: cannot read: {error.strerror or error}") from None
    if len(data) > MAX_BYTES:
        raise MeasurementError(f"{path}: larger than {MAX_BYTES // 2**20} MiB; not a benchmark result")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise MeasurementError(f"{path}: not UTF-8 text (a benchmark JSON or CSV is)") from None


def _number(value: Any) -> float | None:
    """A finite number, or None for absent/null/"inf"/non-numeric."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _positive_int(value: Any) -> int | None:
    number = _number(value)
    return int(number) if number is not None and number >= 1 and number == int(number) else None


def _text(value: Any) -> str | None:
    return str(value).strip() or None if value is not None else None


def _require(value: float | None, what: str, where: str) -> float:
    if value is None or value <= 0:
        raise MeasurementError(f"{where}: no {what} (a positive number) in the run")
    return value


# --- vLLM -----------------------------------------------------------------------------------------------
# Keys of the result JSON that vLLM's serving benchmark writes with --save-result: vllm-project/vllm
# vllm/benchmarks/serve.py (`vllm bench serve`, v0.10 and later; benchmarks/benchmark_serving.py before),
# where main() puts "model_id", "tokenizer_id", "num_prompts", "request_rate" (a number, or the string "inf"),
# "burstiness", "max_concurrency" and every --metadata KEY=VALUE at the top level, then merges benchmark()'s
# result: "completed", "total_input_tokens", "total_output_tokens", "request_throughput", and per metric
# "mean_<m>_ms", "median_<m>_ms", "std_<m>_ms", "p99_<m>_ms" for m in ttft, tpot, itl, e2el; with
# --save-detailed also per-request lists "input_lens", "output_lens", "ttfts" (seconds) and "itls".
VLLM_MARKERS = ("mean_ttft_ms", "median_ttft_ms")


def is_vllm_result(doc: Any) -> bool:
    return isinstance(doc, Mapping) and any(k in doc for k in VLLM_MARKERS)


def vllm_point(doc: Mapping[str, Any], where: str) -> MeasuredPoint:
    completed = _positive_int(doc.get("completed"))
    in_lens, out_lens = doc.get("input_lens"), doc.get("output_lens")
    prompt = output = None
    if isinstance(in_lens, list) and in_lens and isinstance(out_lens, list) and out_lens:
        prompt = _number(sum(x for x in in_lens if isinstance(x, int | float)) / len(in_lens))
        output = _number(sum(x for x in out_lens if isinstance(x, int | float)) / len(out_lens))
    if prompt is None and completed:
        total_in = _number(doc.get("total_input_tokens"))
        total_out = _number(doc.get("total_output_tokens"))
        prompt = total_in / completed if total_in is not None else None
        output = total_out / completed if total_out is not None else None
    prompt = _require(prompt, "prompt length (total_input_tokens with completed, or input_lens)", where)
    output = _require(output, "output length (total_output_tokens with completed, or output_lens)", where)
    ttft = _require(_number(doc.get("mean_ttft_ms")), "mean_ttft_ms", where)
    tpot = _number(doc.get("mean_tpot_ms")) or _number(doc.get("mean_itl_ms"))
    tpot = _require(tpot, "mean_tpot_ms or mean_itl_ms", where)
    median = _number(doc.get("median_ttft_ms"))
    concurrency = _positive_int(doc.get("max_concurrency"))
    rate = _number(doc.get("request_rate"))
    if concurrency is None and rate is None:  # rate "inf" and no cap: every prompt sent at once
        concurrency = _positive_int(doc.get("num_prompts")) or completed
    setup = Setup(
        model=_text(doc.get("model")) or _text(doc.get("model_id")) or "",
        gpu=_text(doc.get("gpu")),
        tp=_positive_int(doc.get("tp")) or _positive_int(doc.get("tensor_parallel_size")),
        dtype=_text(doc.get("dtype")),
        kv_dtype=_text(doc.get("kv_dtype")) or _text(doc.get("kv_cache_dtype")),
        concurrency=concurrency,
        rate=rate if concurrency is None else None,
        prompt_tokens=prompt,
        output_tokens=output,
        num_requests=completed or _positive_int(doc.get("num_prompts")),
        start="burst",
    )
    observed = Observed(ttft / 1000, tpot / 1000, None if median is None else median / 1000)
    return MeasuredPoint(setup, observed, where)


# --- AIPerf / GenAI-Perf --------------------------------------------------------------------------------
# Layout of profile_export_aiperf.json: ai-dynamo/aiperf docs/tutorials/working-with-profile-exports.md
# ("Aggregated Statistics (JSON)"): each metric an object with "unit" and "avg", "p50", ... (e.g.
# "time_to_first_token", "inter_token_latency", "input_sequence_length", "output_sequence_length",
# "request_throughput", "request_count"), and "input_config" with "endpoint": {"model_names": [...]} and
# "loadgen": {"concurrency": N, "request_rate": R, "request_count": N}. GenAI-Perf's
# profile_export_genai_perf.json uses the same metric objects; its input_config holds "model" (a list) and
# "concurrency" / "request_rate" at the top level, or under "perf_analyzer": {"stimulus": {...}} in later
# releases. Both say the input config layout is not a stable interface, so every place is tried.
AIPERF_MARKERS = ("time_to_first_token", "inter_token_latency")


def is_aiperf_export(doc: Any) -> bool:
    return isinstance(doc, Mapping) and all(isinstance(doc.get(k), Mapping) for k in AIPERF_MARKERS)


def _stat_ms(doc: Mapping[str, Any], key: str, stat: str, where: str) -> float | None:
    metric = doc.get(key)
    if not isinstance(metric, Mapping):
        return None
    value = _number(metric.get(stat))
    if value is None:
        return None
    unit = str(metric.get("unit", "ms")).strip().lower()
    scale = {"ms": 1.0, "s": 1000.0, "sec": 1000.0, "us": 1e-3, "ns": 1e-6}.get(unit)
    if scale is None:
        raise MeasurementError(f"{where}: {key} has unit {unit!r}, not ms, s, us or ns")
    return value * scale


def _stat(doc: Mapping[str, Any], key: str, stat: str = "avg") -> float | None:
    metric = doc.get(key)
    return _number(metric.get(stat)) if isinstance(metric, Mapping) else _number(metric)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def aiperf_point(doc: Mapping[str, Any], where: str) -> MeasuredPoint:
    cfg = doc.get("input_config") if isinstance(doc.get("input_config"), Mapping) else {}
    assert isinstance(cfg, Mapping)

    def sub(mapping: Any, key: str) -> Mapping[str, Any]:
        value = mapping.get(key) if isinstance(mapping, Mapping) else None
        return value if isinstance(value, Mapping) else {}

    loadgen, endpoint = sub(cfg, "loadgen"), sub(cfg, "endpoint")
    stimulus = sub(sub(cfg, "perf_analyzer"), "stimulus")
    models = _first(endpoint.get("model_names"), cfg.get("model"), cfg.get("model_names"))
    model = models[0] if isinstance(models, list) and models else models
    concurrency = _positive_int(
        _first(loadgen.get("concurrency"), stimulus.get("concurrency"), cfg.get("concurrency"))
    )
    rate = _number(_first(loadgen.get("request_rate"), stimulus.get("request_rate"), cfg.get("request_rate")))
    ttft = _require(_stat_ms(doc, "time_to_first_token", "avg", where), "time_to_first_token avg", where)
    itl = _require(_stat_ms(doc, "inter_token_latency", "avg", where), "inter_token_latency avg", where)
    prompt = _require(_stat(doc, "input_sequence_length"), "input_sequence_length avg", where)
    output = _require(_stat(doc, "output_sequence_length"), "output_sequence_length avg", where)
    if concurrency is None and rate is None:
        raise MeasurementError(f"{where}: input_config names neither a concurrency nor a request rate")
    setup = Setup(
        model=_text(model) or "",
        gpu=None,
        tp=None,
        dtype=None,
        kv_dtype=None,
        concurrency=concurrency,
        rate=rate if concurrency is None else None,
        prompt_tokens=prompt,
        output_tokens=output,
        num_requests=_positive_int(_stat(doc, "request_count")),
        # AIPerf averages every request of its run from a start with all clients at once; GenAI-Perf reports
        # what perf_analyzer measured over time windows repeated until stable (Triton perf_analyzer docs:
        # "measures ... over a time window, and then repeats the measurements until it gets stable values"),
        # read as the clients' steady state, as NIM's GenAI-Perf table is (disagg.twin.fidelity)
        start="steady" if isinstance(cfg.get("perf_analyzer"), Mapping) else "burst",
    )
    median = _stat_ms(doc, "time_to_first_token", "p50", where)
    return MeasuredPoint(
        setup, Observed(ttft / 1000, itl / 1000, None if median is None else median / 1000), where
    )


# --- CSV ------------------------------------------------------------------------------------------------
CSV_REQUIRED = ("prompt_tokens", "output_tokens", "ttft_ms")
CSV_ALIASES = {
    "isl": "prompt_tokens",
    "input_tokens": "prompt_tokens",
    "osl": "output_tokens",
    "itl_ms": "itl_ms",
    "request_rate": "rate",
    "max_concurrency": "concurrency",
    "tensor_parallel_size": "tp",
}


def csv_points(text: str, path: Path) -> list[MeasuredPoint]:
    """Rows of a measurements CSV; lines starting with ``#`` (provenance notes) are skipped."""
    lines = ["" if line.lstrip().startswith("#") else line for line in text.splitlines()]
    skip = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    reader = csv.DictReader(io.StringIO("\n".join(lines[skip:])))
    if reader.fieldnames is None:
        raise MeasurementError(f"{path}: empty CSV")
    names = {(n or "").strip().lower(): n for n in reader.fieldnames}
    columns = {CSV_ALIASES.get(k, k): v for k, v in names.items()}
    missing = [c for c in CSV_REQUIRED if c not in columns]
    if (
        missing
        or not ({"tpot_ms", "itl_ms"} & columns.keys())
        or not ({"concurrency", "rate"} & columns.keys())
    ):
        raise MeasurementError(
            f"{path}: a measurements CSV needs the columns prompt_tokens, output_tokens, ttft_ms, tpot_ms "
            f"(or itl_ms) and concurrency (or rate), plus model, gpu, tp where the command line does not "
            f"give them; found {sorted(names)}"
        )
    points = []
    for row in reader:
        where = f"{path} line {skip + reader.line_num}"

        def cell(name: str, row: dict[str, str | None] = row) -> str | None:
            column = columns.get(name)
            value = row.get(column) if column is not None else None
            return value.strip() or None if isinstance(value, str) else None

        if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
            continue
        concurrency, rate = _positive_int(cell("concurrency")), _number(cell("rate"))
        if concurrency is None and (rate is None or rate <= 0):
            raise MeasurementError(f"{where}: neither concurrency (an integer >= 1) nor rate (> 0) is set")
        tpot = _number(cell("tpot_ms")) or _number(cell("itl_ms"))
        tp_cell = cell("tp")
        if tp_cell is not None and _positive_int(tp_cell) is None:
            raise MeasurementError(f"{where}: tp {tp_cell!r} is not an integer >= 1")
        median = _number(cell("ttft_median_ms"))
        start = (cell("start") or "steady").lower()
        if start not in START_MODES:
            raise MeasurementError(f"{where}: start {start!r} is not one of {', '.join(START_MODES)}")
        setup = Setup(
            model=cell("model") or "",
            gpu=cell("gpu"),
            tp=_positive_int(tp_cell),
            dtype=cell("dtype"),
            kv_dtype=cell("kv_dtype"),
            concurrency=concurrency,
            rate=rate if concurrency is None else None,
            prompt_tokens=_require(_number(cell("prompt_tokens")), "prompt_tokens", where),
            output_tokens=_require(_number(cell("output_tokens")), "output_tokens", where),
            num_requests=_positive_int(cell("num_requests")),
            start=start,
        )
        ttft = _require(_number(cell("ttft_ms")), "ttft_ms", where)
        tpot = _require(tpot, "tpot_ms (or itl_ms)", where)
        points.append(
            MeasuredPoint(
                setup, Observed(ttft / 1000, tpot / 1000, None if median is None else median / 1000), where
            )
        )
    if not points:
        raise MeasurementError(f"{path}: the CSV has a header but no runs")
    return points


# --- entry point ----------------------------------------------------------------------------------------
def _json_docs(text: str, path: Path) -> list[Any] | None:
    """The JSON documents of a file (one object, a list of them, or JSON Lines), None if it is not JSON."""
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return None
    try:
        doc = json.loads(stripped)
    except json.JSONDecodeError as error:
        lines = [line for line in stripped.splitlines() if line.strip()]
        try:
            return [json.loads(line) for line in lines]
        except json.JSONDecodeError:
            raise MeasurementError(f"{path}: invalid JSON at line {error.lineno}: {error.msg}") from None
    return doc if isinstance(doc, list) else [doc]


def parse_measurements(text: str, path: Path) -> list[MeasuredPoint]:
    docs = _json_docs(text, path)
    if docs is None:
        return csv_points(text, path)
    points = []
    for i, doc in enumerate(docs, start=1):
        where = f"{path}" if len(docs) == 1 else f"{path} run {i}"
        if is_vllm_result(doc):
            points.append(vllm_point(doc, where))
        elif is_aiperf_export(doc):
            points.append(aiperf_point(doc, where))
        else:
            keys = sorted(doc)[:8] if isinstance(doc, Mapping) else type(doc).__name__
            raise MeasurementError(
                f"{where}: not a vLLM serving benchmark result (mean_ttft_ms, ...) nor an AIPerf/GenAI-Perf "
                f"export (time_to_first_token, inter_token_latency); found {keys}"
            )
    if not points:
        raise MeasurementError(f"{path}: no runs in the file")
    return points


def read_measurements(paths: Sequence[Path], defaults: Defaults = Defaults()) -> list[MeasuredPoint]:
    """Every run of every file, with the command line's defaults filled in where a file is silent."""
    points: list[MeasuredPoint] = []
    for path in paths:
        points.extend(apply_defaults(p, defaults) for p in parse_measurements(_read_text(path), path))
    return points
