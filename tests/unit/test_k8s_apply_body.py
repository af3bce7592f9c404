"""Server-side apply bodies are JSON read by the API server as YAML: they must carry characters beyond
the Basic Multilingual Plane as raw UTF-8, never as the surrogate-pair escapes json.dumps writes by
default (go-yaml refuses those), and escape what a YAML reader would refuse or fold.
The real API server's side is tests/integration/test_deployment.py (a servedName with an emoji)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from disagg.k8s.client import yaml_safe_json


@pytest.mark.parametrize(
    "text",
    [
        "llama-\U0001f680",  # an emoji: beyond the BMP
        "caf\u00e9 \u4e2d\u6587",
        "nel\x85 del\x7f c1\x9b",  # go-yaml refuses raw DEL/C1 and folds a raw NEL into a space
        "ls\u2028ps\u2029 bom\ufeff nonchar\ufffe",
        'quote" backslash\\ newline\n tab\t',
    ],
)
def test_the_body_reads_back_unchanged_as_json_and_as_yaml(text: str) -> None:
    body = {"metadata": {"name": "x", "annotations": {text: text}}, "spec": {"args": ["--x", text]}}
    encoded = yaml_safe_json(body)
    assert json.loads(encoded) == body
    assert yaml.safe_load(encoded.decode("utf-8")) == body
    assert not re.search(rb"\\u[dD][89a-fA-F]", encoded)  # no surrogate escape


def test_an_emoji_goes_out_as_raw_utf8() -> None:
    assert yaml_safe_json({"n": "\U0001f680"}) == b'{"n":"\xf0\x9f\x9a\x80"}'
    assert "\\ud83d" in json.dumps({"n": "\U0001f680"})  # what the Kubernetes client sent before
