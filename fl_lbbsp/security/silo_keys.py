"""A federation's key folder as ``fl-lbbsp keys silos`` writes it: one Ed25519 signing key
per silo (``silo-<id>.key``, mode 0600) and the registry of their public keys
(``registry.json``) for the server (:func:`write_silo_keys`), and the check that a
simulation's silos can sign with them (:func:`check_silo_keys`). The identities
themselves, the registry and the signatures are :mod:`fl_lbbsp.security.identity`'s."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from .identity import (
    REGISTRY_FILE,
    IdentityError,
    SiloRegistry,
    check_silo_id,
    key_file_name,
    load_registry,
    load_signing_key,
    public_pem,
    write_file,
)

__all__ = ["SiloKeyFiles", "check_silo_keys", "write_silo_keys"]


def check_silo_keys(folder: str | Path, silos: Sequence[str]) -> SiloRegistry:
    """The registry of a key folder whose ``silo-<id>.key`` files all match it (a
    simulation's silos sign with those files).

    Raises
    ------
    IdentityError
        The registry or a silo's key file is missing or unreadable, a silo is not in the
        registry, or its key is not the one registered.
    """
    registry = load_registry(folder)
    for silo in silos:
        public = registry.keys.get(silo)
        if public is None:
            raise IdentityError(f"{folder}: silo {silo} is not in the silo registry")
        key = load_signing_key(Path(folder) / key_file_name(silo))
        if public_pem(key.public_key()) != public_pem(public):
            raise IdentityError(f"{folder}: silo {silo}'s key is not the one registered")
    return registry


@dataclass(frozen=True)
class SiloKeyFiles:
    """What :func:`write_silo_keys` wrote: each silo's key file and the registry."""

    keys: Mapping[str, Path]
    registry: Path


def write_silo_keys(
    out: str | Path,
    silos: Sequence[str],
    *,
    dataset_sizes: Sequence[int] | None = None,
    overwrite: bool = False,
) -> SiloKeyFiles:
    """Generate one Ed25519 key per silo; write ``silo-<id>.key`` (mode 0600) for each and
    ``registry.json`` (public keys, declared dataset sizes) for the server.

    Parameters
    ----------
    out : str | Path
        The folder (created if needed).
    silos : sequence of str
        The silo ids, distinct.
    dataset_sizes : sequence of int | None (default: None)
        Each silo's declared dataset size, in the order of ``silos``; ``None``: none.
    overwrite : bool (default: False)
        Replace existing files; otherwise an existing one raises ``FileExistsError``.

    Raises
    ------
    ValueError
        No silo, a repeated or invalid id (:func:`check_silo_id`, an
        :class:`IdentityError`), or dataset sizes that do not match the silos or are not
        positive.
    """
    for silo in silos:
        check_silo_id(silo)
    if not silos or len(set(silos)) != len(silos):
        raise ValueError(f"silo ids must be distinct and at least one, got {list(silos)}")
    if dataset_sizes is not None and (
        len(dataset_sizes) != len(silos) or any(n <= 0 for n in dataset_sizes)
    ):
        raise ValueError(
            f"--dataset-sizes needs one positive size per silo ({len(silos)}), "
            f"got {list(dataset_sizes)}"
        )
    folder = Path(out)
    paths = {silo: folder / key_file_name(silo) for silo in silos}
    registry = folder / REGISTRY_FILE
    if not overwrite:
        for path in (*paths.values(), registry):
            if path.exists():
                raise FileExistsError(f"{path} exists; not replacing keys without overwrite")
    folder.mkdir(parents=True, exist_ok=True)
    public: dict[str, Ed25519PublicKey] = {}
    for silo, path in paths.items():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        write_file(path, pem, mode=0o600)
        public[silo] = key.public_key()
    sizes = {} if dataset_sizes is None else dict(zip(silos, dataset_sizes, strict=True))
    content = SiloRegistry(keys=public, dataset_sizes=sizes).to_json()
    write_file(registry, (json.dumps(content, indent=2) + "\n").encode(), mode=0o644)
    return SiloKeyFiles(keys=paths, registry=registry)
