"""CKKS encryption of updates: parameters, keys, chunked weighted encryption, the server's
checks and sums, and what the server can and cannot do with its context."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from pydantic import ValidationError

ts = pytest.importorskip("tenseal")

from fl_lbbsp.crypto import (  # noqa: E402
    CKKSConfig,
    EncryptedUpdate,
    InvalidUpdateError,
    KeyFileError,
    NonFiniteUpdateError,
    UpdateChecker,
    aggregate_updates,
    decrypt_update,
    encrypt_update,
    flatten,
    generate_keys,
    load_server_keys,
    load_silo_keys,
    unflatten,
    write_key_files,
)
from fl_lbbsp.crypto.records import update_from_record, update_to_record  # noqa: E402

SLOTS = 4096  # N = 8192


@pytest.fixture(scope="session")
def key_files(tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_key_files(generate_keys(), tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def silo_keys(key_files):  # type: ignore[no-untyped-def]
    return load_silo_keys(key_files.secret)


@pytest.fixture(scope="session")
def server_keys(key_files):  # type: ignore[no-untyped-def]
    return load_server_keys(key_files.public)


@pytest.fixture(scope="session")
def foreign_keys():  # type: ignore[no-untyped-def]
    """Another federation's key with exactly the same parameters."""
    return generate_keys()


# -------------------------------------------------------------------------- parameters
def test_default_parameters_are_the_short_chain() -> None:
    # Execute
    config = CKKSConfig()

    # Assert
    assert (config.poly_modulus_degree, config.coeff_mod_bit_sizes) == (8192, (60, 40))
    assert config.scale == 2.0**40 and config.slots == SLOTS
    assert config.max_abs_value == 2.0**19


@pytest.mark.parametrize(
    ("settings", "field", "value"),
    [
        ({"poly_modulus_degree": 5000}, "poly_modulus_degree", "5000"),
        ({"poly_modulus_degree": 1024}, "poly_modulus_degree", "1024"),
        ({"coeff_mod_bit_sizes": (60,)}, "coeff_mod_bit_sizes", r"\[60\]"),
        ({"coeff_mod_bit_sizes": (61, 40)}, "coeff_mod_bit_sizes", "61"),
        ({"coeff_mod_bit_sizes": (40, 40)}, "too short", "scale_bits=40"),
        ({"coeff_mod_bit_sizes": (30, 20), "scale_bits": 25}, "too short", "scale_bits=25"),
        ({"poly_modulus_degree": 4096, "coeff_mod_bit_sizes": (60, 40, 40)}, "109", "140"),
    ],
)
def test_bad_parameters_are_rejected_naming_field_and_value(settings, field, value) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert
    with pytest.raises(ValidationError, match=field) as info:
        CKKSConfig(**settings)
    assert info.match(value)


# -------------------------------------------------------------------------------- keys
def test_server_context_is_public_has_no_extra_keys_and_cannot_decrypt(
    silo_keys, server_keys
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    update = encrypt_update(silo_keys, np.arange(10.0), weight=1.0)
    vector = ts.ckks_vector_from(server_keys.context, update.chunks[0])

    # Execute / Assert
    assert server_keys.context.is_private() is False
    assert silo_keys.context.is_private() is True
    assert not server_keys.context.has_galois_keys()
    assert not server_keys.context.has_relin_keys()
    with pytest.raises(ValueError, match="secret"):
        vector.decrypt()
    with pytest.raises(ValueError, match="secret context"):
        decrypt_update(server_keys, update)
    assert server_keys.fingerprint == silo_keys.fingerprint


def test_secret_key_never_appears_in_the_servers_file(key_files, silo_keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the secret key as SEAL serializes it
    path = tmp_path / "sk"
    silo_keys.context.secret_key().data.save(str(path))
    secret = path.read_bytes()

    # Execute
    public_file = key_files.public.read_bytes()
    secret_file = key_files.secret.read_bytes()

    # Assert: present in the silos' file (so the check can fail), absent from the server's
    assert secret in secret_file
    assert secret not in public_file
    assert secret[:64] not in public_file
    assert key_files.secret.stat().st_mode & 0o077 == 0


def test_server_loader_refuses_the_secret_context_and_silo_loader_the_public(key_files) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert
    with pytest.raises(KeyFileError, match="holds the secret key"):
        load_server_keys(key_files.secret)
    with pytest.raises(KeyFileError, match="no secret key"):
        load_silo_keys(key_files.public)
    assert load_server_keys(key_files.public.parent).is_private is False  # folder works


@pytest.mark.parametrize("damage", ["not a key file", "flip", "truncate", "fingerprint"])
def test_damaged_or_mismatched_key_files_are_refused(key_files, tmp_path, damage) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    data = bytearray(key_files.public.read_bytes())
    if damage == "not a key file":
        data = bytearray(b"hello")
    elif damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) // 2]
    path = tmp_path / "public.ckks"
    path.write_bytes(bytes(data))
    expected = "0" * 64 if damage == "fingerprint" else None

    # Execute / Assert
    with pytest.raises(KeyFileError):
        load_server_keys(path, fingerprint=expected)


def test_write_key_files_does_not_overwrite_by_default(key_files, silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert
    with pytest.raises(FileExistsError):
        write_key_files(silo_keys, key_files.secret.parent)


# --------------------------------------------------------------- encrypt, sum, decrypt
@pytest.mark.parametrize("size", [1, SLOTS - 1, SLOTS, SLOTS + 1, 3 * SLOTS + 17])
def test_any_length_round_trips_in_chunks_of_n_over_2(silo_keys, size: int) -> None:
    # Prepare
    values = np.random.default_rng(size).normal(size=size)

    # Execute
    update = encrypt_update(silo_keys, values, weight=3.0, total=4.0)
    decrypted = decrypt_update(silo_keys, update)

    # Assert
    assert len(update.chunks) == -(-size // SLOTS)
    assert update.weight == 0.75
    np.testing.assert_allclose(decrypted, values, atol=1e-6)


def test_server_sum_decrypts_to_the_weighted_average(silo_keys, server_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 silos with dataset sizes 100, 300, 600 announced against S = 1000
    rng = np.random.default_rng(0)
    updates = [rng.normal(size=5000) for _ in range(3)]
    sizes = [100, 300, 600]
    sent = [
        encrypt_update(silo_keys, u, weight=n, total=1000, max_contributors=3)
        for u, n in zip(updates, sizes, strict=True)
    ]
    checker = UpdateChecker(server_keys, num_values=5000)

    # Execute
    total = aggregate_updates(server_keys, [checker.check(u) for u in sent])
    result = decrypt_update(silo_keys, total)

    # Assert
    assert total.weight == pytest.approx(1.0)
    assert total.contributors == 3
    np.testing.assert_allclose(result, np.average(updates, axis=0, weights=sizes), atol=1e-6)


def test_dropped_silo_needs_no_renormalisation(silo_keys, server_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: S announced for 3 silos, only 2 reply
    updates = [np.full(10, 1.0), np.full(10, 4.0)]
    sent = [
        encrypt_update(silo_keys, u, weight=n, total=600)
        for u, n in zip(updates, [100, 300], strict=True)
    ]
    checker = UpdateChecker(server_keys)

    # Execute
    result = decrypt_update(
        silo_keys, aggregate_updates(server_keys, [checker.check(u) for u in sent])
    )

    # Assert: (100 * 1 + 300 * 4) / 400
    np.testing.assert_allclose(result, np.full(10, 3.25), atol=1e-6)


def test_lenet_sized_update_costs_at_most_35_bytes_per_parameter(silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: LeNet-5 on 32x32 inputs has 61,706 parameters
    values = np.random.default_rng(1).normal(scale=0.1, size=61706)

    # Execute
    update = encrypt_update(silo_keys, values, weight=1.0)
    error = np.abs(decrypt_update(silo_keys, update) - values).max()

    # Assert
    assert update.nbytes / values.size <= 35
    assert error <= 1e-6


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_updates_are_refused_before_encryption(silo_keys, bad: float) -> None:
    # Prepare
    arrays = {"w": np.ones((2, 3), dtype=np.float32), "b": np.array([1.0, bad])}
    flat, layout = flatten(arrays)

    # Execute / Assert
    with pytest.raises(NonFiniteUpdateError, match="index 7, tensor 'b'"):
        encrypt_update(silo_keys, flat, weight=1.0, layout=layout)


def test_values_too_large_for_the_scale_are_refused(silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert: 2^19 is the range; 10 silos share it
    encrypt_update(silo_keys, np.full(3, 2.0e4), weight=1.0, max_contributors=10)
    with pytest.raises(ValueError, match="CKKS range"):
        encrypt_update(silo_keys, np.full(3, 3.0e4), weight=1.0, max_contributors=10)


def test_flatten_and_unflatten_keep_names_shapes_and_dtypes() -> None:
    # Prepare
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "n": np.array(7, dtype=np.int64)}

    # Execute
    flat, layout = flatten(arrays)
    back = unflatten(flat + 1e-9, layout)

    # Assert
    assert list(back) == ["a", "n"]
    assert back["a"].dtype == np.float32 and back["a"].shape == (2, 3)
    assert back["n"].dtype == np.int64 and int(back["n"]) == 7


def test_update_round_trips_through_an_array_record(silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    _, layout = flatten({"w": np.zeros(5000)})
    update = encrypt_update(silo_keys, np.ones(5000), weight=2.0, layout=layout)

    # Execute
    back = update_from_record(update_to_record(update))

    # Assert
    assert back == update


# ------------------------------------------------------------------ the server's checks
def _damaged(update: EncryptedUpdate, damage: str, foreign: EncryptedUpdate) -> EncryptedUpdate:
    chunks = list(update.chunks)
    if damage == "foreign key, own fingerprint claimed":
        return dataclasses.replace(foreign, fingerprint=update.fingerprint)
    if damage == "foreign key":
        return foreign
    if damage == "truncated":
        chunks[1] = chunks[1][: len(chunks[1]) // 2]
        return dataclasses.replace(update, chunks=tuple(chunks), digests=())
    if damage == "corrupted":
        broken = bytearray(chunks[0])
        broken[5000] ^= 0xFF
        chunks[0] = bytes(broken)
        return dataclasses.replace(update, chunks=tuple(chunks))
    if damage == "unparsable":
        broken = bytearray(chunks[0])
        broken[:64] = bytes(64)
        chunks[0] = bytes(broken)
        return dataclasses.replace(update, chunks=tuple(chunks), digests=())
    if damage == "chunk missing":
        return dataclasses.replace(update, chunks=tuple(chunks[:-1]), digests=update.digests[:-1])
    if damage == "wrong length":
        return dataclasses.replace(update, num_values=update.num_values - 1)
    if damage == "zero weight":
        return dataclasses.replace(update, weight=0.0)
    raise AssertionError(damage)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("foreign key", "another key"),
        ("truncated", "bytes"),
        ("corrupted", "corrupted"),
        ("unparsable", "not a CKKS ciphertext"),
        ("chunk missing", "chunks"),
        ("wrong length", "values"),
        ("zero weight", "weight"),
    ],
)
def test_checker_rejects_bad_updates_with_a_reason(
    silo_keys, server_keys, foreign_keys, damage, reason
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    values = np.ones(2 * SLOTS + 5)
    update = encrypt_update(silo_keys, values, weight=1.0)
    foreign = encrypt_update(foreign_keys, values, weight=1.0)
    checker = UpdateChecker(server_keys, num_values=values.size)
    checker.check(update)  # the undamaged update passes

    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match=reason):
        checker.check(_damaged(update, damage, foreign))


def test_foreign_key_ciphertext_is_silently_accepted_by_tenseal(
    silo_keys, server_keys, foreign_keys
) -> None:  # type: ignore[no-untyped-def]
    """Why fingerprints: same parameters, another key, and TenSEAL sums it into garbage."""
    # Prepare
    ours = encrypt_update(silo_keys, np.ones(10), weight=1.0)
    theirs = encrypt_update(foreign_keys, np.ones(10), weight=1.0)

    # Execute
    total = ts.ckks_vector_from(server_keys.context, ours.chunks[0]) + ts.ckks_vector_from(
        server_keys.context, theirs.chunks[0]
    )
    decrypted = ts.ckks_vector_from(silo_keys.context, total.serialize()).decrypt()

    # Assert: no error anywhere, and the sum is far from 2
    assert np.abs(np.array(decrypted) - 2.0).max() > 1e3


def test_unreadable_header_is_rejected() -> None:
    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match="header"):
        EncryptedUpdate.from_parts(b"{not json", [b""])


def test_asymmetric_mode_encrypts_with_the_public_key_and_sums_the_same() -> None:
    # Prepare
    keys = generate_keys(CKKSConfig(encryption="asymmetric", poly_modulus_degree=4096))
    public = keys.public()
    values = [np.linspace(-1, 1, 3000), np.linspace(1, -1, 3000)]
    checker = UpdateChecker(public, num_values=3000)

    # Execute: the server could encrypt too; silos' updates still only add up
    sent = [
        encrypt_update(public, v, weight=n, total=4) for v, n in zip(values, [1, 3], strict=True)
    ]
    result = decrypt_update(keys, aggregate_updates(public, [checker.check(u) for u in sent]))

    # Assert
    assert public.context.has_public_key() and not public.is_private
    assert public.fingerprint == keys.fingerprint
    np.testing.assert_allclose(result, 0.25 * values[0] + 0.75 * values[1], atol=1e-6)
