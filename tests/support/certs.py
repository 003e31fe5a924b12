"""Throwaway certificate authorities with a loopback server certificate or a client certificate, for the TLS tests."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.net import HOST


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_certs(directory: Path, *, common_name: str = "specwatch-test", names: tuple[str, ...] = ()) -> Certs:
    """A throwaway CA and a server certificate for 127.0.0.1/localhost (and `names`) signed by it (PEM files)."""
    sans = [x509.DNSName("localhost"), *(x509.DNSName(n) for n in names), x509.IPAddress(ipaddress.ip_address(HOST))]
    return _issue(directory, "server", common_name, sans, ExtendedKeyUsageOID.SERVER_AUTH)


def client_certs(directory: Path, *, san: str) -> Certs:
    """A throwaway CA for client certificates and a client certificate for `san` signed by it (PEM files)."""
    return _issue(directory, "client", san, [x509.DNSName(san)], ExtendedKeyUsageOID.CLIENT_AUTH)


def server_tls(certs: Certs) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certs.cert, certs.key)
    return context


def _issue(directory: Path, role: str, common_name: str, sans: list[x509.GeneralName], usage: x509.ObjectIdentifier) -> Certs:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} CA")])
    ca_cert = (
        _valid(x509.CertificateBuilder(), now).subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _valid(x509.CertificateBuilder(), now).subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_name).public_key(key.public_key())
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    certs = Certs(ca=directory / f"{role}-ca.pem", cert=directory / f"{role}.pem", key=directory / f"{role}-key.pem")
    certs.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    certs.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    certs.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.NoEncryption()))
    return certs


def _valid(builder: x509.CertificateBuilder, now: datetime.datetime) -> x509.CertificateBuilder:
    """A day's validity from a few minutes ago, and a random serial number."""
    return (builder.serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1)))
