"""CKKS key generation, key files and key fingerprints.

One key serves a whole federation. The silos share the secret context (they encrypt their
updates and decrypt the aggregate); the server gets the public context only: no secret
key, no public key, no Galois keys and no relinearisation keys: silos encrypt with the
secret key (seeded symmetric ciphertexts) and the server only multiplies ciphertexts by
integers and adds them, so it holds the parameters and no key at all. Both files
start with a JSON header carrying the parameters, the key's fingerprint and a checksum of
the context; silos recompute the fingerprint from their secret key on loading.

TenSEAL accepts a ciphertext made under any key with the same parameters and silently
returns garbage when it is added to ours; the fingerprint is what tells them apart.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import tenseal as ts

from ..security.identity import IdentityError, check_private_file, write_file
from .config import CKKSConfig
from .seal import Seal, save_object

__all__ = [
    "PUBLIC_CONTEXT_FILE",
    "SECRET_CONTEXT_FILE",
    "CKKSKeys",
    "KeyFileError",
    "KeyFiles",
    "generate_keys",
    "key_fingerprint",
    "load_keys",
    "load_server_keys",
    "load_silo_keys",
    "write_key_files",
]

SECRET_CONTEXT_FILE = "secret.ckks"
PUBLIC_CONTEXT_FILE = "public.ckks"
FINGERPRINT_FILE = "fingerprint.txt"
CONFIG_FILE = "ckks.json"
_MAGIC = b"fl_lbbsp-ckks-context/2\n"
_OLD_MAGIC = b"fl_lbbsp-ckks-context/1\n"
_FINGERPRINT_TAG = b"fl_lbbsp-ckks-key-fingerprint/1\0"


class KeyFileError(ValueError):
    """A key file that cannot be used: wrong format, wrong kind, or tampered with."""


@dataclass(frozen=True)
class CKKSKeys:
    """A loaded TenSEAL CKKS context with its parameters and key fingerprint.

    Parameters
    ----------
    context : tenseal.Context
        The context; holds the secret key on silos, only the public key on the server.
    config : CKKSConfig
        The parameters the context was made with.
    fingerprint : str
        The key's fingerprint (:func:`key_fingerprint`).
    """

    context: ts.Context
    config: CKKSConfig
    fingerprint: str

    @property
    def is_private(self) -> bool:
        """Whether the context holds the secret key (silos) or not (server)."""
        return bool(self.context.is_private())

    @cached_property
    def seal(self) -> Seal:
        """SEAL's encoder, evaluator and (with the secret key) encryptor and decryptor."""
        return Seal(self.context)

    def public(self) -> CKKSKeys:
        """The same keys without the secret key: what the server may hold."""
        return _from_bytes(_serialize(self, private=False), expect_private=False)

    def to_bytes(self, *, private: bool) -> bytes:
        """Serialize to the key-file format, with the secret key only if ``private``."""
        if private and not self.is_private:
            raise KeyFileError("these keys hold no secret key to write")
        return _serialize(self, private=private)


@dataclass(frozen=True)
class KeyFiles:
    """Paths written by :func:`write_key_files`."""

    secret: Path
    """Secret context for the silos (mode 0600)."""
    public: Path
    """Public context for the server."""
    fingerprint: Path
    """The key fingerprint, one hex line."""
    config: Path
    """Parameters and fingerprint as JSON, for people."""


def key_fingerprint(context: ts.Context) -> str:
    """Fingerprint of a secret context's key: hex sha256 of a tag and the serialized key.

    Computed where the secret key is (key generation, silos) and written into both key
    files; different for any other key, even with the same parameters. The hash reveals
    nothing usable about the key.

    Raises
    ------
    ValueError
        If the context holds no secret key.
    """
    if not context.is_private():
        raise ValueError("the fingerprint is computed from the secret key; this context has none")
    key = save_object(context.secret_key().data)
    return hashlib.sha256(_FINGERPRINT_TAG + key).hexdigest()


def generate_keys(config: CKKSConfig | None = None) -> CKKSKeys:
    """Generate a fresh CKKS key pair (secret context, in memory).

    Parameters
    ----------
    config : CKKSConfig | None (default: None)
        Parameters; ``None`` means the defaults (N=4096, primes [60, 40], scale 2^35).

    Reference: Cheon et al., ASIACRYPT 2017 (CKKS); Benaissa et al., "TenSEAL", 2021.
    """
    config = config or CKKSConfig()
    context = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=config.poly_modulus_degree,
        coeff_mod_bit_sizes=list(config.coeff_mod_bit_sizes),
        encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC,
    )
    context.global_scale = config.scale
    keys = CKKSKeys(context=context, config=config, fingerprint=key_fingerprint(context))
    # Round-trip so that the in-memory context is exactly what a key file holds (no relin
    # or Galois keys, which TenSEAL makes by default and a sum never needs).
    return _from_bytes(_serialize(keys, private=True), expect_private=True)


def write_key_files(keys: CKKSKeys, out_dir: str | Path, *, overwrite: bool = False) -> KeyFiles:
    """Write the silos' secret context, the server's public context and the fingerprint.

    Parameters
    ----------
    keys : CKKSKeys
        Keys holding the secret key (from :func:`generate_keys`).
    out_dir : str | Path
        Folder to write to (created if missing).
    overwrite : bool (default: False)
        Replace existing key files; otherwise an existing file raises ``FileExistsError``.
    """
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    files = KeyFiles(
        secret=folder / SECRET_CONTEXT_FILE,
        public=folder / PUBLIC_CONTEXT_FILE,
        fingerprint=folder / FINGERPRINT_FILE,
        config=folder / CONFIG_FILE,
    )
    if not overwrite:
        for path in (files.secret, files.public, files.fingerprint, files.config):
            if path.exists():
                raise FileExistsError(f"{path} exists; not replacing keys without overwrite")
    write_file(files.secret, keys.to_bytes(private=True), mode=0o600)
    write_file(files.public, keys.to_bytes(private=False), mode=0o644)
    write_file(files.fingerprint, (keys.fingerprint + "\n").encode(), mode=0o644)
    meta = {"fingerprint": keys.fingerprint, "ckks": keys.config.model_dump(mode="json")}
    write_file(files.config, (json.dumps(meta, indent=2) + "\n").encode(), mode=0o644)
    return files


def load_keys(
    path: str | Path, *, private: bool | None = None, fingerprint: str | None = None
) -> CKKSKeys:
    """Load a key file written by :func:`write_key_files`.

    Parameters
    ----------
    path : str | Path
        The key file.
    private : bool | None (default: None)
        ``True``: the file must hold the secret key; ``False``: it must not.
    fingerprint : str | None (default: None)
        Expected key fingerprint (e.g. from ``fingerprint.txt``).

    Raises
    ------
    KeyFileError
        If the file is not a key file, holds the wrong kind of context, its key does
        not match its header or ``fingerprint``, or it holds the secret key and is
        accessible by group or others (as ssh refuses such a private key; the message
        gives the ``chmod 600`` fix).
    """
    file = Path(path)
    if not file.is_file():
        raise KeyFileError(f"key file {file} does not exist")
    try:
        data = file.read_bytes()
    except OSError as err:
        raise KeyFileError(f"key file {file} cannot be read ({err.strerror})") from None
    keys = _from_bytes(data, expect_private=private, source=str(file))
    if keys.is_private:
        try:
            check_private_file(file)
        except IdentityError as err:
            raise KeyFileError(str(err)) from None
    if fingerprint is not None and fingerprint.strip() != keys.fingerprint:
        raise KeyFileError(
            f"{file} holds key {keys.fingerprint[:16]}..., expected {fingerprint.strip()[:16]}..."
        )
    return keys


def load_server_keys(path: str | Path, *, fingerprint: str | None = None) -> CKKSKeys:
    """Load the server's public context; refuse a file that holds the secret key.

    ``path`` may be the key folder (its ``public.ckks`` is used).
    """
    file = Path(path)
    return load_keys(
        file / PUBLIC_CONTEXT_FILE if file.is_dir() else file,
        private=False,
        fingerprint=fingerprint,
    )


def load_silo_keys(path: str | Path, *, fingerprint: str | None = None) -> CKKSKeys:
    """Load a silo's secret context. ``path`` may be the key folder (``secret.ckks``)."""
    file = Path(path)
    return load_keys(
        file / SECRET_CONTEXT_FILE if file.is_dir() else file,
        private=True,
        fingerprint=fingerprint,
    )


# ---------------------------------------------------------------------------- helpers
def _serialize(keys: CKKSKeys, *, private: bool) -> bytes:
    body = keys.context.serialize(
        save_public_key=False,
        save_secret_key=private,
        save_galois_keys=False,
        save_relin_keys=False,
    )
    header = json.dumps(
        {
            "private": private,
            "fingerprint": keys.fingerprint,
            "ckks": keys.config.model_dump(mode="json"),
            "context_sha256": hashlib.sha256(body).hexdigest(),
        },
        sort_keys=True,
    ).encode()
    return bytes(_MAGIC + struct.pack(">I", len(header)) + header + body)


def _from_bytes(data: bytes, *, expect_private: bool | None, source: str = "key data") -> CKKSKeys:
    if data.startswith(_OLD_MAGIC):
        raise KeyFileError(
            f"{source} is a CKKS key of an older fl_lbbsp (pre-weighted, unseeded updates); "
            "regenerate the federation's keys with `fl-lbbsp keys generate --out DIR`"
        )
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + 4:
        raise KeyFileError(f"{source} is not an fl_lbbsp CKKS key file")
    start = len(_MAGIC) + 4
    (size,) = struct.unpack(">I", data[len(_MAGIC) : start])
    body = data[start + size :]
    try:
        header: dict[str, Any] = json.loads(data[start : start + size])
        config = CKKSConfig(**header["ckks"])
        if hashlib.sha256(body).hexdigest() != header["context_sha256"]:
            raise ValueError("the context does not match its checksum (altered or damaged)")
        context = ts.context_from(body)
    except Exception as err:  # noqa: BLE001 - any parse failure means a bad file
        raise KeyFileError(f"{source} cannot be read: {err}") from err
    is_private = bool(context.is_private())
    if is_private != bool(header.get("private")):
        raise KeyFileError(f"{source}: header and context disagree on holding the secret key")
    if expect_private is True and not is_private:
        raise KeyFileError(f"{source} holds no secret key; silos need the secret context")
    if expect_private is False and is_private:
        raise KeyFileError(
            f"{source} holds the secret key; the server must get the public context only"
        )
    fingerprint = str(header.get("fingerprint", ""))
    if len(fingerprint) != 64 or not all(c in "0123456789abcdef" for c in fingerprint):
        raise KeyFileError(f"{source}: header has no valid key fingerprint")
    if is_private and key_fingerprint(context) != fingerprint:
        raise KeyFileError(
            f"{source}: its secret key does not match the fingerprint in its header; "
            "the file was altered"
        )
    degree = context.seal_context().data.key_context_data().parms().poly_modulus_degree()
    if degree != config.poly_modulus_degree or context.global_scale != config.scale:
        raise KeyFileError(f"{source}: context parameters do not match the header")
    return CKKSKeys(context=context, config=config, fingerprint=fingerprint)
