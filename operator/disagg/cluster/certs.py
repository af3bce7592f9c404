"""TLS material for the local control plane, generated in Python.

One CA signs the kube-apiserver serving certificate, the LeaderWorkerSet controller's webhook serving
certificate (127.0.0.1: the API server calls it by URL, with this CA as the caBundle) and the client
certificates of the admin, the controller-manager, the scheduler, kwok, the LeaderWorkerSet controller and
the aggregation layer's front proxy;
an RSA key pair signs and verifies ServiceAccount tokens.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey


@dataclass(frozen=True)
class CertSettings:
    validity_days: int = 365
    apiserver_dns: tuple[str, ...] = (
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    )
    apiserver_ips: tuple[str, ...] = ("127.0.0.1",)


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate's subject: the user name (CN) and groups (O) the apiserver sees."""

    name: str
    user: str
    groups: tuple[str, ...] = ()


FRONT_PROXY_CLIENT = "front-proxy-client"
# The identities the control plane's own clients use; `system:masters` bypasses RBAC for the admin.
CLIENT_IDENTITIES: tuple[ClientIdentity, ...] = (
    ClientIdentity("admin", "kubernetes-admin", ("system:masters",)),
    ClientIdentity("controller-manager", "system:kube-controller-manager"),
    ClientIdentity("scheduler", "system:kube-scheduler"),
    ClientIdentity("kwok", "kwok-controller", ("system:masters",)),
    # bound to the ClusterRole the LWS release ships (config/rbac/role.yaml), as its Helm chart does
    ClientIdentity("lws-controller", "lws-controller-manager"),
    # The aggregation layer's proxy client: the API server presents it to extension API servers (the
    # metrics adapter), which trust the X-Remote-* headers only from this name.
    ClientIdentity(FRONT_PROXY_CLIENT, FRONT_PROXY_CLIENT),
)


@dataclass(frozen=True)
class Pki:
    """Paths of the generated files (PEM)."""

    directory: Path

    @property
    def ca_cert(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    @property
    def apiserver_cert(self) -> Path:
        return self.directory / "apiserver.crt"

    @property
    def apiserver_key(self) -> Path:
        return self.directory / "apiserver.key"

    @property
    def sa_key(self) -> Path:
        return self.directory / "sa.key"

    @property
    def sa_pub(self) -> Path:
        return self.directory / "sa.pub"

    @property
    def webhook_dir(self) -> Path:
        """The LWS webhook server's certificate directory (controller-runtime reads tls.crt, tls.key)."""
        return self.directory / "lws-webhook"

    @property
    def webhook_cert(self) -> Path:
        return self.webhook_dir / "tls.crt"

    @property
    def webhook_key(self) -> Path:
        return self.webhook_dir / "tls.key"

    def client_cert(self, name: str) -> Path:
        return self.directory / f"{name}.crt"

    def client_key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    def complete(self) -> bool:
        files = [self.ca_cert, self.ca_key, self.apiserver_cert, self.apiserver_key, self.sa_key, self.sa_pub]
        files += [self.webhook_cert, self.webhook_key]
        for ident in CLIENT_IDENTITIES:
            files += [self.client_cert(ident.name), self.client_key(ident.name)]
        return all(path.is_file() for path in files)


def _new_ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
    return x509.Name(attrs)


def _validity(settings: CertSettings) -> tuple[dt.datetime, dt.datetime]:
    now = dt.datetime.now(dt.UTC)
    return now - dt.timedelta(minutes=5), now + dt.timedelta(days=settings.validity_days)


def make_ca(settings: CertSettings) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _new_ec_key()
    not_before, not_after = _validity(settings)
    subject = _name("disagg-local-ca")
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    common_name: str,
    *,
    organizations: tuple[str, ...] = (),
    dns_names: tuple[str, ...] = (),
    ip_addresses: tuple[str, ...] = (),
    server: bool = False,
    settings: CertSettings | None = None,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf certificate signed by the CA: a server certificate with SANs, or a client certificate."""
    settings = settings or CertSettings()
    key = _new_ec_key()
    not_before, not_after = _validity(settings)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name, organizations))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if dns_names or ip_addresses:
        sans: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def generate_pki(
    directory: Path, service_ip: str, settings: CertSettings | None = None, *, overwrite: bool = False
) -> Pki:
    """Write the CA, serving, client and ServiceAccount material; reuse it if it is already complete."""
    settings = settings or CertSettings()
    pki = Pki(directory)
    if pki.complete() and not overwrite:
        return pki
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert = make_ca(settings)
    _write(pki.ca_key, _key_pem(ca_key), private=True)
    _write(pki.ca_cert, _cert_pem(ca_cert))
    server_key, server_cert = issue_certificate(
        ca_key,
        ca_cert,
        "kube-apiserver",
        dns_names=settings.apiserver_dns,
        ip_addresses=(*settings.apiserver_ips, service_ip),
        server=True,
        settings=settings,
    )
    _write(pki.apiserver_key, _key_pem(server_key), private=True)
    _write(pki.apiserver_cert, _cert_pem(server_cert))
    webhook_key, webhook_cert = issue_certificate(
        ca_key,
        ca_cert,
        "lws-webhook",
        dns_names=("localhost",),
        ip_addresses=settings.apiserver_ips,
        server=True,
        settings=settings,
    )
    pki.webhook_dir.mkdir(exist_ok=True)
    _write(pki.webhook_key, _key_pem(webhook_key), private=True)
    _write(pki.webhook_cert, _cert_pem(webhook_cert))
    for ident in CLIENT_IDENTITIES:
        key, cert = issue_certificate(
            ca_key, ca_cert, ident.user, organizations=ident.groups, settings=settings
        )
        _write(pki.client_key(ident.name), _key_pem(key), private=True)
        _write(pki.client_cert(ident.name), _cert_pem(cert))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write(pki.sa_key, _key_pem(sa_key), private=True)
    _write(
        pki.sa_pub,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return pki
