"""The certificates that have signed an agent's audit checkpoints, kept for ``audit verify``.

An agent whose identity comes from the Workload API signs checkpoints with an
SVID that SPIRE replaces every few minutes; nobody keeps those certificates.
So the agent appends each new signer's certificate (the leaf: public, no key)
to a PEM file beside the checkpoint file, ``<checkpoints>.signers.pem``, before
it signs with it; ``audit verify --config`` reads them all back. The file only
helps verification find a line's certificate: a certificate added by someone
else verifies nothing that its key did not sign, and the checkpoint's agent id
must still match.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from gateway.errors import ConfigError


def signers_file(checkpoint_file: Path) -> Path:
    """Where the signer certificates of ``checkpoint_file`` are kept."""
    return checkpoint_file.with_name(checkpoint_file.name + ".signers.pem")


def remember_signer(path: Path, cert_pem: bytes) -> None:
    """Append the leaf of ``cert_pem`` to ``path`` unless it is there already (fsynced).

    Raises:
        OSError: the file cannot be read or appended to.
    """
    leaf = x509.load_pem_x509_certificates(cert_pem)[0].public_bytes(serialization.Encoding.PEM)
    if path.exists() and leaf in path.read_bytes():
        return
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(descriptor, leaf)
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def read_signers(path: Path) -> list[bytes]:
    """Every certificate in ``path``, one PEM each (none if the file does not exist).

    Raises:
        ConfigError: the file is unreadable or holds something that is not a certificate.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ConfigError(f"checkpoint signers file {path}: unreadable ({err.strerror})") from err
    try:
        certificates = x509.load_pem_x509_certificates(data) if data.strip() else []
    except ValueError as err:
        raise ConfigError(f"checkpoint signers file {path}: not PEM certificates") from err
    return [c.public_bytes(serialization.Encoding.PEM) for c in certificates]
