"""TLS material of a local federation: a throw-away CA and the SuperLink's certificate
(:func:`generate_tls`), and one authentication key pair per SuperNode
(:func:`generate_node_keys`, for Flower's SuperNode authentication). Made with
``cryptography``; private keys are written readable by the owner only."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ...security.identity import write_file

__all__ = ["NodeKeys", "TlsFiles", "generate_node_keys", "generate_tls"]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a local CA and the SuperLink's certificate signed by it."""

    ca_cert: Path
    """CA certificate: SuperNodes' ``--root-certificates``, the CLI's ``root-certificates``."""
    server_cert: Path
    """SuperLink certificate (``--ssl-certfile``), valid for 127.0.0.1 and localhost."""
    server_key: Path
    """SuperLink private key (``--ssl-keyfile``), readable by the owner only."""


def generate_tls(
    folder: str | Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    valid_days: int = 30,
) -> TlsFiles:
    """Create a CA and a server certificate for ``hosts`` in ``folder``.

    Parameters
    ----------
    folder : str | Path
        Where ``ca.pem``, ``ca.key``, ``server.pem`` and ``server.key`` are written
        (created if missing; keys get mode 0600).
    hosts : sequence of str (default: ("127.0.0.1", "localhost"))
        Subject alternative names of the server certificate: IP addresses or DNS names.
    valid_days : int (default: 30)
        Validity of both certificates.

    Returns
    -------
    TlsFiles
        Paths of the CA certificate and the server certificate and key.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if valid_days <= 0:
        raise ValueError(f"valid_days must be positive, got {valid_days!r}")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    start, end = now - dt.timedelta(minutes=5), now + dt.timedelta(days=valid_days)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fl_lbbsp local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
        .sign(ca_key, hashes.SHA256())
    )

    files = TlsFiles(
        ca_cert=out / "ca.pem", server_cert=out / "server.pem", server_key=out / "server.key"
    )
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    pkcs8 = serialization.PrivateFormat.PKCS8
    for path, key in ((out / "ca.key", ca_key), (files.server_key, server_key)):
        pem = key.private_bytes(serialization.Encoding.PEM, pkcs8, serialization.NoEncryption())
        write_file(path, pem, mode=0o600)
    return files


@dataclass(frozen=True)
class NodeKeys:
    """A SuperNode's authentication key pair (Flower's SuperNode authentication)."""

    private_key: Path
    """OpenSSH private key (``flower-supernode --auth-supernode-private-key``), mode 0600."""
    public_key: Path
    """OpenSSH public key, registered with ``flwr supernode register``."""


def generate_node_keys(folder: str | Path, names: Sequence[str]) -> dict[str, NodeKeys]:
    """Create one EC (NIST P-384) key pair per SuperNode in ``folder``.

    Parameters
    ----------
    folder : str | Path
        Where ``<name>`` and ``<name>.pub`` are written (created if missing; private
        keys get mode 0600).
    names : sequence of str
        One key pair per name (the silo ids).

    Returns
    -------
    dict of str to NodeKeys
        The key files of each name.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    found: dict[str, NodeKeys] = {}
    for name in names:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.startswith("."):
            raise ValueError(f"silo id {name!r} cannot name a key file")
        key = ec.generate_private_key(ec.SECP384R1())
        files = NodeKeys(private_key=out / name, public_key=out / f"{name}.pub")
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
        write_file(files.private_key, private, mode=0o600)
        files.public_key.write_bytes(
            key.public_key().public_bytes(
                serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
            )
        )
        found[name] = files
    return found
