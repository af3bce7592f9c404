"""How the operator reaches a secured Prometheus: TLS verified by default (system CAs or a CA bundle),
a bearer token from a (Secret-mounted) file, extra headers; wired from the settings and the flags.

The HTTPS tests run a real TLS server on loopback (Python's ssl, a CA made by disagg.cluster.certs) that
answers the Prometheus HTTP API and records the headers it was sent."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from disagg.cluster.certs import CertSettings, issue_certificate, make_ca
from disagg.controller.autoscaler import Autoscaler
from disagg.controller.cli import configure, operator_settings
from disagg.controller.settings import AutoscalingSettings
from disagg.metrics.prometheus import PrometheusAccess, PrometheusSignals
from disagg.metrics.queries import QuerySet
from disagg.policy.types import SignalState

QUERIES = QuerySet({"up": "up"})


class _Handler(BaseHTTPRequestHandler):
    seen: list[dict[str, str]]
    required_authorization: str | None

    def do_GET(self) -> None:  # the Prometheus HTTP API's instant query, one sample
        type(self).seen.append(dict(self.headers.items()))
        if self.required_authorization and self.headers.get("Authorization") != self.required_authorization:
            self.send_response(401)
            self.end_headers()
            return
        body = json.dumps(
            {
                "status": "success",
                "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "3"]}]},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


class _TlsPrometheus:
    def __init__(self, tmp: Path, required_authorization: str | None) -> None:
        ca_key, ca_cert = make_ca(CertSettings())
        key, cert = issue_certificate(ca_key, ca_cert, "prometheus", ip_addresses=("127.0.0.1",), server=True)
        self.ca_file = tmp / "ca.crt"
        self.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        (tmp / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (tmp / "tls.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        handler = type("Handler", (_Handler,), {"seen": [], "required_authorization": required_authorization})
        self.handler = handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tmp / "tls.crt", tmp / "tls.key")
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def seen(self) -> list[dict[str, str]]:
        return self.handler.seen

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def tls_prometheus(tmp_path: Path) -> Iterator[_TlsPrometheus]:
    server = _TlsPrometheus(tmp_path, required_authorization="Bearer s3cret-token")
    try:
        yield server
    finally:
        server.close()


def test_tls_is_verified_by_default_and_only_turned_off_explicitly() -> None:
    assert PrometheusSignals("https://p:9090").client()._session.verify is True
    assert PrometheusAccess(ca_file="/ca.pem").verify() == "/ca.pem"
    skipped = PrometheusSignals("https://p:9090", access=PrometheusAccess(insecure_skip_verify=True))
    assert skipped.client()._session.verify is False


def test_the_bearer_token_is_read_from_its_file_at_every_client(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    access = PrometheusAccess(bearer_token_file=str(token), headers=(("X-Scope-OrgID", "team-a"),))
    signals = PrometheusSignals("https://p:9090", access=access)
    assert signals.client().headers == {"X-Scope-OrgID": "team-a", "Authorization": "Bearer first"}
    token.write_text("rotated")  # a Secret update rewrites the mounted file
    assert signals.client().headers["Authorization"] == "Bearer rotated"


def test_credentials_never_show_in_the_repr() -> None:
    access = PrometheusAccess(bearer_token_file="/t", headers=(("Authorization", "Basic c2VjcmV0"),))
    assert "c2VjcmV0" not in repr(PrometheusSignals("https://p", access=access))
    settings = AutoscalingSettings(prometheus_headers={"Authorization": "Basic c2VjcmV0"})
    assert "c2VjcmV0" not in repr(settings)


def test_an_unreadable_token_makes_every_signal_missing_with_the_file_named(tmp_path: Path) -> None:
    access = PrometheusAccess(bearer_token_file=str(tmp_path / "absent"))
    signals = PrometheusSignals("https://p:9090", access=access).run(QUERIES)
    assert signals.get("up").state is SignalState.MISSING
    assert str(tmp_path / "absent") in signals.errors["up"]
    (tmp_path / "empty").write_text("\n")
    empty = PrometheusSignals(
        "https://p:9090", access=PrometheusAccess(bearer_token_file=str(tmp_path / "empty"))
    )
    assert "is empty" in empty.run(QUERIES).errors["up"]


def test_https_prometheus_with_a_private_ca_and_a_bearer_token(
    tls_prometheus: _TlsPrometheus, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    # verification on by default: a certificate from an unknown CA is refused (the signal is missing)
    unverified = PrometheusSignals(tls_prometheus.url, access=PrometheusAccess(bearer_token_file=str(token)))
    refused = unverified.run(QUERIES)
    assert refused.get("up").state is SignalState.MISSING and "SSL" in refused.errors["up"]
    assert tls_prometheus.seen == []  # nothing, the token least of all, was sent to an unverified server
    # the CA bundle and the token: answered
    access = PrometheusAccess(ca_file=str(tls_prometheus.ca_file), bearer_token_file=str(token))
    answered = PrometheusSignals(tls_prometheus.url, access=access).run(QUERIES)
    assert answered.get("up").value == 3.0 and answered.errors == {}
    assert tls_prometheus.seen[-1]["Authorization"] == "Bearer s3cret-token"
    # a wrong token: Prometheus' 401 is a missing signal, not a crash
    token.write_text("wrong")
    assert (
        PrometheusSignals(tls_prometheus.url, access=access).run(QUERIES).get("up").state
        is SignalState.MISSING
    )


def test_settings_from_the_environment_and_flags_reach_the_adapter(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    monkeypatch.setenv("DISAGG_PROMETHEUS_URL", "https://prom:9090")
    monkeypatch.setenv("DISAGG_PROMETHEUS_HEADERS", '{"X-Scope-OrgID": "team-a"}')
    monkeypatch.setenv("DISAGG_PROMETHEUS_BEARER_TOKEN_FILE", "/var/run/secrets/prometheus/token")
    parser = argparse.ArgumentParser()
    configure(parser)
    settings = operator_settings(parser.parse_args(["-n", "a", "--prometheus-ca-file", "/etc/ca.pem"]))
    access = settings.autoscaling.prometheus_access()
    assert access == PrometheusAccess(
        ca_file="/etc/ca.pem",
        bearer_token_file="/var/run/secrets/prometheus/token",
        headers=(("X-Scope-OrgID", "team-a"),),
    )
    autoscaler = Autoscaler.create(object(), settings.autoscaling, object())  # type: ignore[arg-type]
    assert autoscaler.signals is not None
    assert autoscaler.signals.adapter.access == access  # type: ignore[attr-defined]
    insecure = operator_settings(parser.parse_args(["-n", "a", "--prometheus-insecure-skip-verify"]))
    assert insecure.autoscaling.prometheus_access().verify() is False
