"""Local PKI for the sandbox: one CA, the apiserver's serving cert, client certs, the SA key.

One CA signs both serving and client certificates: the sandbox lives on loopback for one test
session, so the separation a production cluster wants (client CA vs serving CA vs front proxy)
buys nothing here and would triple the files to manage.
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

_VALIDITY = dt.timedelta(days=30)


@dataclass(frozen=True)
class CertPaths:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Paths of everything the control plane needs; created by :func:`create_pki`."""

    dir: Path
    ca: CertPaths
    apiserver: CertPaths
    sa_private_key: Path
    sa_public_key: Path

    def client(self, name: str) -> CertPaths:
        return CertPaths(self.dir / f"{name}.crt", self.dir / f"{name}.key")


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _name(common_name: str, organizations: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    attrs += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
    return x509.Name(attrs)


def _load_ca(ca: CertPaths) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    cert = x509.load_pem_x509_certificate(ca.cert.read_bytes())
    key = serialization.load_pem_private_key(ca.key.read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{ca.key} is not an EC key")
    return cert, key


def _issue(
    ca: CertPaths,
    out: CertPaths,
    subject: x509.Name,
    *,
    server_names: tuple[str, ...] = (),
    client: bool = False,
) -> CertPaths:
    ca_cert, ca_key = _load_ca(ca)
    key = _key()
    now = dt.datetime.now(dt.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [ExtendedKeyUsageOID.SERVER_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if server_names:
        sans: list[x509.GeneralName] = []
        for name in server_names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(name)))
            except ValueError:
                sans.append(x509.DNSName(name))
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    out.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(out.key, key)
    return out


def create_pki(directory: Path) -> Pki:
    """Create (or reuse, when complete) the sandbox PKI under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    pki = Pki(
        dir=directory,
        ca=CertPaths(directory / "ca.crt", directory / "ca.key"),
        apiserver=CertPaths(directory / "apiserver.crt", directory / "apiserver.key"),
        sa_private_key=directory / "sa.key",
        sa_public_key=directory / "sa.pub",
    )
    if all(p.exists() for p in (pki.ca.cert, pki.apiserver.cert, pki.sa_public_key)):
        return pki

    ca_key = _key()
    now = dt.datetime.now(dt.UTC)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("gpuheal-sandbox-ca"))
        .issuer_name(_name("gpuheal-sandbox-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + _VALIDITY)
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
        .sign(ca_key, hashes.SHA256())
    )
    pki.ca.cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    _write_key(pki.ca.key, ca_key)

    _issue(
        pki.ca,
        pki.apiserver,
        _name("kube-apiserver"),
        server_names=(
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "10.96.0.1",
        ),
    )
    # Service-account tokens are signed with RSA: every Kubernetes version accepts RS256.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(pki.sa_private_key, sa_key)
    pki.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pki


def issue_client_cert(pki: Pki, name: str, user: str, groups: tuple[str, ...] = ()) -> CertPaths:
    """A client certificate for ``user`` in ``groups`` (Kubernetes reads CN and O)."""
    return _issue(pki.ca, pki.client(name), _name(user, groups), client=True)


def issue_server_cert(pki: Pki, name: str, server_names: tuple[str, ...]) -> CertPaths:
    """A serving certificate for ``server_names`` (IP addresses and DNS names), signed by the
    sandbox CA (what a test's Slurm bridge serves HTTPS with)."""
    return _issue(pki.ca, pki.client(name), _name(name), server_names=server_names)
