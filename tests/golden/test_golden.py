"""Golden files: what `disagg render` prints for every example, and the CRDs `disagg crds` writes.

Regenerate after an intended change (then review the diff):
    for f in examples/*.yaml; do .venv/bin/disagg render -f $f > tests/golden/$(basename $f); done
    .venv/bin/disagg crds
"""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from disagg.api.cli import stale_files
from disagg.api.crd import rendered_files
from disagg.api.support import SUPPORT_MATRIX
from disagg.render.cli import render_text

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden"
REGENERATE = "for f in examples/*.yaml; do .venv/bin/disagg render -f $f > tests/golden/$(basename $f); done"


def test_every_accepted_combination_has_an_example_and_no_refused_one_does() -> None:
    accepted = {f"{c.engine}-{c.connector}" for c in SUPPORT_MATRIX if c.accepted}
    refused = {f"{c.engine}-{c.connector}" for c in SUPPORT_MATRIX if not c.accepted}
    stems = {p.stem for p in EXAMPLES}
    assert stems >= accepted == {"vllm-nixl", "sglang-mooncake", "sglang-nixl"}
    assert not stems & refused


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_matches_golden(example: Path) -> None:
    golden = GOLDEN / example.name
    assert golden.is_file(), f"no golden file for {example.name}; run: {REGENERATE}"
    rendered = render_text(example.read_text(), str(example))
    expected = golden.read_text()
    if rendered != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                rendered.splitlines(keepends=True),
                "golden",
                "rendered",
                n=2,
            )
        )
        pytest.fail(
            f"{example.name} renders differently from its golden file; if intended run: {REGENERATE}\n{diff}"
        )


def test_crds_are_up_to_date() -> None:
    stale = stale_files(ROOT / "crds")
    assert not stale, f"stale CRD files {[str(p) for p in stale]}; run: .venv/bin/disagg crds"
    assert set(rendered_files()) <= {p.name for p in (ROOT / "crds").glob("*.yaml")}
