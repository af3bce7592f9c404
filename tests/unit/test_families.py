"""Traffic families (disagg.twin.families): determinism, the train/test protocol, each family's property."""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np
import pytest

from disagg.twin import families
from disagg.twin.families import (
    FAMILIES,
    MAX_REQUESTS,
    AnyFamily,
    Diurnal,
    FlashBursts,
    HeavyTail,
    MixShift,
    MultiTurn,
    PrefixReuse,
    Ranges,
    Split,
    params_dict,
    sample_params,
    training_set,
)
from disagg.twin.traffic import Request

# short versions of each family: the properties do not need a full hour
SMALL: dict[str, AnyFamily] = {
    "diurnal": Diurnal(duration_s=1800, peak_rate=6.0),
    "flash-bursts": FlashBursts(duration_s=900, base_rate=3.0, bursts_per_hour=8, burst_share=0.1),
    "mix-shift": MixShift(duration_s=1200, phase_s=300, chat_rate=5, code_rate=4, docs_rate=1),
    "heavy-tail": HeavyTail(duration_s=900, rate=4.0),
    "prefix-reuse": PrefixReuse(duration_s=900, rate=3.0),
    "multi-turn": MultiTurn(duration_s=900, session_rate=0.2),
}


def arrivals(reqs: list[Request]) -> np.ndarray:
    return np.array([r.arrival_s for r in reqs])


def test_every_family_has_a_small_example() -> None:
    assert set(SMALL) == set(FAMILIES) == set(families.family_names())


@pytest.mark.parametrize("name", sorted(SMALL))
def test_deterministic_per_seed_and_seeds_differ(name: str) -> None:
    fam = SMALL[name]
    a, b, c = fam.generate(3), fam.generate(3), fam.generate(4)
    assert a == b
    assert a != c
    assert len(a) > 100
    t = arrivals(a)
    assert np.all(np.diff(t) >= 0)  # sorted
    assert t.min() >= 0 and t.max() < fam.duration_s
    assert all(r.prompt_tokens >= 1 and r.output_tokens >= 1 for r in a)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_sampled_params_inside_their_ranges(name: str) -> None:
    cls = FAMILIES[name]
    rng = np.random.default_rng(1)
    splits: tuple[tuple[Split, Ranges], ...] = (("train", cls.TRAIN), ("test", cls.TEST))
    for split, ranges in splits:
        for _ in range(5):
            p = params_dict(sample_params(name, rng, split))
            for key, (lo, hi) in ranges.items():
                if key in cls.RATES:  # may be scaled down to the request budget
                    assert p[key] <= hi + 1e-9
                else:
                    assert lo - 0.5 <= p[key] <= hi + 0.5, (split, key, p[key])
    # "beyond": every parameter whose test range extends past the training range lies outside it
    for _ in range(5):
        p = params_dict(sample_params(name, rng, "beyond"))
        for key, (lo, hi) in cls.TEST.items():
            tlo, thi = cls.TRAIN[key]
            if key not in cls.RATES and (lo < tlo or hi > thi):
                assert not tlo < p[key] < thi, (key, p[key])


def test_train_and_test_sets_are_disjoint_and_reproducible() -> None:
    train, test = training_set(), families.test_set()
    assert 8 <= len(train) <= 12 and 8 <= len(test) <= 12
    assert [c.name for c in train] == [c.name for c in training_set()]
    assert [c.params for c in test] == [c.params for c in families.test_set()]
    assert not {c.seed for c in train} & {c.seed for c in test}
    assert not {c.params for c in train} & {c.params for c in test}
    assert len({c.name for c in train + test}) == len(train) + len(test)
    assert {c.family for c in train} == {c.family for c in test} == set(FAMILIES)
    assert {c.split for c in train} == {"train"}
    assert {c.split for c in test} == {"test", "beyond"}
    for c in train + test:
        # every parameter inside its split's declared ranges (the case's span included); rates may sit
        # below theirs, scaled down to the request budget
        declared = type(c.params).TRAIN if c.split == "train" else type(c.params).TEST
        for key, (lo, hi) in declared.items():
            if key not in type(c.params).RATES:
                assert lo <= getattr(c.params, key) <= hi, (c.name, key)
        assert c.params.expected_requests() <= MAX_REQUESTS * 1.001
        assert c.ttft_slo_s > 0 and c.itl_slo_s == 0.05


def test_the_validation_set_is_drawn_like_the_test_set_but_shares_nothing_with_it() -> None:
    train, test, valid = training_set(), families.test_set(), families.validation_set()
    assert len(valid) == len(test)
    assert [c.params for c in valid] == [c.params for c in families.validation_set()]
    for other in (train, test):
        assert not {c.seed for c in valid} & {c.seed for c in other}
        assert not {c.params for c in valid} & {c.params for c in other}
        assert not {c.name for c in valid} & {c.name for c in other}
    assert {c.split for c in valid} == {"test", "beyond"}
    assert all(c.name.startswith(f"{c.family}/validation-") for c in valid)


def test_test_set_reaches_outside_the_training_ranges() -> None:
    outside: dict[str, set[str]] = defaultdict(set)
    for c in families.test_set():
        cls = FAMILIES[c.family]
        for key, value in params_dict(c.params).items():
            if key in cls.TRAIN and not cls.TRAIN[key][0] <= value <= cls.TRAIN[key][1]:
                outside[c.family].add(key)
    assert set(outside) == set(FAMILIES)
    assert "peak_to_trough" in outside["diurnal"] or "steepness" in outside["diurnal"]


def test_long_context_families_get_a_looser_ttft_slo() -> None:
    assert MultiTurn.ttft_slo_s >= 10.0 > Diurnal.ttft_slo_s == FlashBursts.ttft_slo_s == 2.0


def test_diurnal_peak_to_trough_ratio() -> None:
    fam = Diurnal(duration_s=3600, peak_rate=20.0, peak_to_trough=5.0, noise_cv=0.0, peak_at=0.5)
    t = arrivals(fam.generate(11))
    bins = np.bincount((t // 120).astype(int), minlength=30) / 120.0  # 2-minute rates
    peak = bins[14:16].mean()  # around the middle of the day
    trough = np.concatenate([bins[:1], bins[-1:]]).mean()  # the nights at both ends
    assert peak == pytest.approx(20.0, rel=0.15)
    assert peak / trough == pytest.approx(5.0, rel=0.3)
    # a steeper ramp: the rate stays lower in the shoulders of the day
    steep = Diurnal(duration_s=3600, peak_rate=20.0, peak_to_trough=5.0, noise_cv=0.0, steepness=3.0)
    assert len(steep.generate(11)) < 0.8 * len(t)
    # the noise changes the rate minute to minute but keeps its mean
    noisy = Diurnal(duration_s=3600, peak_rate=20.0, peak_to_trough=5.0, noise_cv=0.3, peak_at=0.5)
    assert len(noisy.generate(11)) == pytest.approx(len(t), rel=0.15)


def test_diurnal_peak_position() -> None:
    early = Diurnal(duration_s=3600, peak_at=0.3, noise_cv=0.0)
    t = arrivals(early.generate(2))
    counts = np.bincount((t // 300).astype(int), minlength=12)
    assert int(np.argmax(counts)) in (3, 4)  # 0.3 of 3600 s = 1080 s


def test_flash_bursts_are_shorter_than_an_evaluation_interval() -> None:
    fam = FlashBursts(duration_s=1800, base_rate=4.0, bursts_per_hour=10, burst_s=12.0, burst_share=0.1)
    assert fam.bursts == 5 and fam.burst_requests == 160
    t = arrivals(fam.generate(5))
    assert len(t) == pytest.approx(4.0 * 1800 / 0.9, rel=0.05)
    per_s = np.bincount(t.astype(int), minlength=1800)
    hot = per_s > 4.0 + 0.5 * 160 / 12.0  # well above the baseline
    runs, run = [], 0
    for h in hot:
        if h:
            run += 1
        elif run:
            runs.append(run)
            run = 0
    assert len(runs) >= 4
    assert max(runs) < 30
    assert sum(runs) <= 5 * 12 + 5
    assert per_s.max() > 3 * 4.0  # the hottest second: over three times the baseline


def test_mix_shift_moves_between_chat_code_and_documents() -> None:
    fam = MixShift(duration_s=3600, phase_s=600, ramp_s=60, chat_rate=6, code_rate=6, docs_rate=1.5)
    reqs = fam.generate(9)
    t = arrivals(reqs)
    prompt = np.array([r.prompt_tokens for r in reqs])
    output = np.array([r.output_tokens for r in reqs])
    phases = fam.phases(np.random.default_rng(9))
    assert [c for _, c in phases[:5]] == ["chat", "code", "docs", "code", "chat"]
    # median lengths per 5-minute bin: long prompts in document phases, short outputs in code phases
    bins = (t // 300).astype(int)
    med_prompt = [float(np.median(prompt[bins == b])) for b in range(12)]
    med_out = [float(np.median(output[bins == b])) for b in range(12)]
    assert max(med_prompt) > 4 * min(med_prompt)
    assert min(med_out) < 0.5 * max(med_out)


def test_heavy_tail_lengths_are_heavy_tailed_and_correlated() -> None:
    fam = HeavyTail(duration_s=1800, rate=5.0, prompt_sigma=1.5, rho=0.6)
    reqs = fam.generate(4)
    p = np.array([r.prompt_tokens for r in reqs], dtype=float)
    o = np.array([r.output_tokens for r in reqs], dtype=float)
    assert np.quantile(p, 0.99) > 15 * np.median(p)  # a log-normal tail
    rho = np.corrcoef(np.log(p), np.log(o))[0, 1]
    assert rho == pytest.approx(0.6, abs=0.1)
    flat = HeavyTail(duration_s=1800, rate=5.0, rho=0.0).generate(4)
    lp = np.log([r.prompt_tokens for r in flat])
    lo = np.log([r.output_tokens for r in flat])
    assert abs(np.corrcoef(lp, lo)[0, 1]) < 0.1
    # bursty arrivals: inter-arrival coefficient of variation above Poisson's 1
    gaps = np.diff(arrivals(reqs))
    assert gaps.std() / gaps.mean() > 1.2


def test_prefix_reuse_hashes_one_per_block_shared_across_requests() -> None:
    fam = PrefixReuse(duration_s=900, rate=4.0, reuse_p=0.8, n_prefixes=10, prefix_mean=4000)
    reqs = fam.generate(6)
    for r in reqs:
        assert len(r.prefix_hashes) == -(-r.prompt_tokens // 512)
    firsts: dict[int, int] = defaultdict(int)
    for r in reqs:
        firsts[r.prefix_hashes[0]] += 1
    shared = sum(n for n in firsts.values() if n > 1)
    assert shared / len(reqs) == pytest.approx(0.8, abs=0.08)
    # requests with the same first block share the prefix's full blocks, then diverge
    by_first: dict[int, list[tuple[int, ...]]] = defaultdict(list)
    for r in reqs:
        by_first[r.prefix_hashes[0]].append(r.prefix_hashes)
    group = max(by_first.values(), key=len)
    common = min(len(h) for h in group) - 1
    assert all(h[:common] == group[0][:common] for h in group) or common == 0
    assert len({h[-1] for h in group}) == len(group)  # every request's last block is its own
    never = PrefixReuse(duration_s=900, rate=4.0, reuse_p=0.0).generate(6)
    blocks = [h for r in never for h in r.prefix_hashes]
    assert len(blocks) == len(set(blocks))


def test_multi_turn_prompts_grow_and_share_the_session_prefix() -> None:
    fam = MultiTurn(duration_s=1800, session_rate=0.2, turns_mean=5, think_s=20, system_tokens=1024)
    reqs = fam.generate(8)
    prompts = np.array([r.prompt_tokens for r in reqs])
    assert prompts.min() >= 1024 + 1000 and prompts.max() <= fam.max_context
    assert np.median(prompts) > 8000  # long context
    system = reqs[0].prefix_hashes[:2]
    assert all(r.prefix_hashes[:2] == system for r in reqs)  # the system prompt's two blocks
    # group turns into sessions by their first block after the system prompt
    sessions: dict[int, list[Request]] = defaultdict(list)
    for r in reqs:
        sessions[r.prefix_hashes[2]].append(r)
    multi = [s for s in sessions.values() if len(s) > 1]
    assert len(multi) > 0.4 * len(sessions)
    for turns in multi:
        for a, b in itertools.pairwise(turns):
            assert b.arrival_s > a.arrival_s
            assert b.prompt_tokens > a.prompt_tokens + a.output_tokens  # history plus a new message
            full = a.prompt_tokens // 512
            assert b.prefix_hashes[:full] == a.prefix_hashes[:full]  # the previous prompt's full blocks
            assert b.prefix_hashes[full:] != a.prefix_hashes[full : len(b.prefix_hashes)]
            assert b.arrival_s - a.arrival_s >= 0.03 * a.output_tokens  # the answer streams first


def test_sampling_caps_the_request_count() -> None:
    rng = np.random.default_rng(0)
    for name in FAMILIES:
        for _ in range(3):
            assert sample_params(name, rng, "test").expected_requests() <= MAX_REQUESTS * 1.001
    huge = Diurnal(peak_rate=500.0)
    assert huge.expected_requests() > MAX_REQUESTS
