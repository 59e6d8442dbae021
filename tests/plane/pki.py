"""Certificates and keys for the plane: one CA, the serving and client certificates, the
ServiceAccount signing key. ECDSA P-256 throughout (fast to make, accepted everywhere)."""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALID = dt.timedelta(days=3650)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn),
                      *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs)])


@dataclass
class Pair:
    cert: Path
    key: Path


class Authority:
    """A self-signed CA in ``dir``, and the certificates it signs beside it."""

    def __init__(self, dir: Path) -> None:
        self.dir = dir
        dir.mkdir(parents=True, exist_ok=True)
        self._key = _key()
        now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
        self._cert = (x509.CertificateBuilder().subject_name(_name("edl-kubeplane-ca")).issuer_name(
            _name("edl-kubeplane-ca")).public_key(self._key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now).not_valid_after(now + _VALID)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .sign(self._key, hashes.SHA256()))
        self.cert = dir / "ca.crt"
        self.cert.write_bytes(self._cert.public_bytes(serialization.Encoding.PEM))
        (dir / "ca.key").write_bytes(_pem_key(self._key))

    def issue(self, stem: str, cn: str, orgs: tuple[str, ...] = (), *, server: bool = False,
              client: bool = False, dns: tuple[str, ...] = (), ips: tuple[str, ...] = ()) -> Pair:
        key = _key()
        now = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=5)
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        b = (x509.CertificateBuilder().subject_name(_name(cn, orgs)).issuer_name(self._cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now).not_valid_after(now + _VALID)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if dns or ips:
            b = b.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName(d) for d in dns] + [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]),
                critical=False)
        cert = b.sign(self._key, hashes.SHA256())
        pair = Pair(self.dir / f"{stem}.crt", self.dir / f"{stem}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(_pem_key(key))
        pair.key.chmod(0o600)
        return pair


def signing_key(dir: Path) -> tuple[Path, Path]:
    """The ServiceAccount token signing key and its public half."""
    key = _key()
    priv, pub = dir / "sa.key", dir / "sa.pub"
    priv.write_bytes(_pem_key(key))
    priv.chmod(0o600)
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return priv, pub
