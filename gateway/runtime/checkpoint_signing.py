"""Who signs the audit checkpoints: the agent's own key, worker 0 only."""

from __future__ import annotations

import logging

from gateway.audit.checkpoint import Checkpointer, CheckpointSigner
from gateway.audit.signer_archive import remember_signer, signers_file
from gateway.config import AgentConfig, WorkloadApiTls
from gateway.transport.tls import TlsMaterial

_log = logging.getLogger(__name__)


def checkpointer(config: AgentConfig, worker: int, material: TlsMaterial) -> Checkpointer | None:
    """The checkpoint writer of ``config`` (None when off, or not worker 0: one per chain).

    Raises:
        ConfigError: the settings or the key are not usable.
    """
    settings = config.audit_checkpoints
    if not settings.enabled or worker != 0:
        return None
    return Checkpointer(
        checkpoint_signer(config, material),
        config.checkpoint_file,
        every_records=settings.every_records,
        every_seconds=settings.every_seconds,
    )


def checkpoint_signer(config: AgentConfig, material: TlsMaterial) -> CheckpointSigner:
    """A signer with the key and certificate of ``material``.

    Raises:
        ConfigError: the key cannot be loaded or is of another type.
    """
    return CheckpointSigner(config.id, material.key_pem, material.cert_pem)


def keep_signer_certificate(config: AgentConfig, material: TlsMaterial) -> None:
    """With the Workload API, archive the signing certificate beside the checkpoints.

    Nobody else keeps a short-lived SVID: ``audit verify`` finds it there. A
    failure is logged (the checkpoints are still written).
    """
    if not isinstance(config.tls, WorkloadApiTls):
        return
    path = signers_file(config.checkpoint_file)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        remember_signer(path, material.cert_pem)
    except OSError as err:
        _log.error(
            "cannot keep the checkpoint signer's certificate in %s (%s): "
            "audit verify needs it given with --cert",
            path,
            err.strerror,
        )
