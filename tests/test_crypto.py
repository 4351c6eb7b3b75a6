"""CKKS encryption of updates: parameters and their error bound, keys, seeded chunked
encryption, the server's checks and integer-weighted sums, and what the server can and
cannot do with its context."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
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
    integer_weights,
    load_server_keys,
    load_silo_keys,
    unflatten,
    write_key_files,
)
from fl_lbbsp.crypto.records import update_from_record, update_to_record  # noqa: E402
from fl_lbbsp.crypto.seal import save_object  # noqa: E402

sealapi = pytest.importorskip("tenseal.sealapi")

PER = 4096  # values per ciphertext: N = 4096, two per complex slot


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
def test_default_parameters_meet_the_error_target_with_room_for_the_weights() -> None:
    # Execute
    config = CKKSConfig()

    # Assert: one 60-bit data prime at N = 4096, 1e-6 of a 1/8 range with a margin of 2,
    # weights up to 2^21, values up to 4, 100 bits in all (109 allowed)
    assert (config.poly_modulus_degree, config.coeff_mod_bit_sizes) == (4096, (60, 40))
    assert config.values_per_ciphertext == PER and config.slots == PER // 2
    assert config.error_bound <= 1e-6 * (1 / 8) / 2
    assert config.weight_bits == 21 and config.max_abs_value == 4.0


@pytest.mark.parametrize(
    ("settings", "field", "value"),
    [
        ({"poly_modulus_degree": 5000}, "poly_modulus_degree", "5000"),
        ({"poly_modulus_degree": 1024}, "poly_modulus_degree", "1024"),
        ({"coeff_mod_bit_sizes": (60,)}, "coeff_mod_bit_sizes", r"\[60\]"),
        ({"coeff_mod_bit_sizes": (60, 40, 40)}, "exactly two primes", r"\[60, 40, 40\]"),
        ({"coeff_mod_bit_sizes": (61, 40)}, "coeff_mod_bit_sizes", "61"),
        ({"coeff_mod_bit_sizes": (40, 40)}, "too short", "scale_bits=35"),
        ({"scale_bits": 50}, "too short", "value_bits=2"),
        ({"poly_modulus_degree": 2048, "coeff_mod_bit_sizes": (40, 20)}, "54", "60"),
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
    update = encrypt_update(silo_keys, np.linspace(-1, 1, 10))

    # Execute / Assert
    assert server_keys.context.is_private() is False
    assert silo_keys.context.is_private() is True
    assert not server_keys.context.has_galois_keys()
    assert not server_keys.context.has_relin_keys()
    assert server_keys.seal.encryptor is None and server_keys.seal.decryptor is None
    with pytest.raises(ValueError, match="secret context"):
        decrypt_update(server_keys, update)
    with pytest.raises(ValueError, match="secret context"):
        encrypt_update(server_keys, np.linspace(-1, 1, 10))
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


def test_a_key_of_the_previous_format_is_refused_with_one_line_saying_how_to_regenerate(
    key_files, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the same file under the previous format's magic line
    data = key_files.public.read_bytes().replace(
        b"fl_lbbsp-ckks-context/2\n", b"fl_lbbsp-ckks-context/1\n", 1
    )
    path = tmp_path / "public.ckks"
    path.write_bytes(data)

    # Execute
    with pytest.raises(KeyFileError) as info:
        load_server_keys(path)

    # Assert
    message = str(info.value)
    assert "\n" not in message
    assert "older fl_lbbsp" in message and "fl-lbbsp keys generate" in message


# --------------------------------------------------------------- encrypt, sum, decrypt
@pytest.mark.parametrize("size", [1, 2, PER - 1, PER, PER + 1, 3 * PER + 17])
def test_any_length_round_trips_in_chunks_of_n_values(silo_keys, size: int) -> None:
    # Prepare
    values = np.random.default_rng(size).uniform(-1, 1, size=size)

    # Execute
    update = encrypt_update(silo_keys, values)
    decrypted = decrypt_update(silo_keys, update)

    # Assert
    assert len(update.chunks) == -(-size // PER)
    assert (update.weight, update.contributors, update.aggregate) == (1, 1, False)
    np.testing.assert_allclose(decrypted, values, atol=silo_keys.config.error_bound)


def test_fresh_ciphertexts_are_seeded_half_the_size_of_an_aggregate(silo_keys, server_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    values = np.random.default_rng(3).uniform(-1, 1, size=PER)
    checker = UpdateChecker(server_keys)

    # Execute
    fresh = encrypt_update(silo_keys, values)
    aggregate = aggregate_updates(server_keys, [checker.check(fresh)], [1])

    # Assert: c0 and a seed against c0 and c1, each c at 60 bits a coefficient, or more
    config = silo_keys.config
    information = config.poly_modulus_degree * config.data_bits / 8
    assert information <= len(fresh.chunks[0]) <= 8 * config.poly_modulus_degree + 1024
    assert len(aggregate.chunks[0]) >= 2 * information
    assert len(fresh.chunks[0]) < 0.51 * len(aggregate.chunks[0])
    np.testing.assert_allclose(decrypt_update(silo_keys, aggregate), values, atol=1e-7)


def test_an_unseeded_fresh_ciphertext_is_refused_by_its_size(silo_keys, server_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the same values encrypted into a full ciphertext (c1 sent whole)
    seal = silo_keys.seal
    plain, full = sealapi.Plaintext(), sealapi.Ciphertext()
    seal.encoder.encode([0.5 + 0.5j] * (PER // 2), seal.parms_id, silo_keys.config.scale, plain)
    seal.encryptor.encrypt_symmetric(plain, full)
    update = EncryptedUpdate(
        chunks=(save_object(full),), weight=1, num_values=PER, fingerprint=silo_keys.fingerprint,
        slots=PER,
    )  # fmt: skip

    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match="fresh seeded ciphertext"):
        UpdateChecker(server_keys).check(update)
    np.testing.assert_allclose(
        decrypt_update(silo_keys, update, checker=_lenient(silo_keys)), 0.5, atol=1e-7
    )


def _lenient(keys):  # type: ignore[no-untyped-def]
    """A checker that takes fresh chunks of an aggregate's size (to show the bytes decrypt)."""
    checker = UpdateChecker(keys)
    checker.chunk_bytes[1] = checker.chunk_bytes[2]
    return checker


def test_server_sum_weighs_each_update_by_its_integer_weight(silo_keys, server_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 3 silos with dataset sizes 100, 300, 600, unweighted updates
    rng = np.random.default_rng(0)
    updates = [rng.uniform(-2, 2, size=5000) for _ in range(3)]
    sizes = [100, 300, 600]
    sent = [encrypt_update(silo_keys, u) for u in updates]
    checker = UpdateChecker(server_keys, num_values=5000)

    # Execute
    total = aggregate_updates(server_keys, [checker.check(u) for u in sent], sizes)
    result = decrypt_update(silo_keys, total)

    # Assert
    assert (total.weight, total.contributors, total.aggregate) == (1000, 3, True)
    np.testing.assert_allclose(
        result, np.average(updates, axis=0, weights=sizes), atol=silo_keys.config.error_bound
    )


@pytest.mark.parametrize(
    ("size", "low", "high", "silos"),
    [
        (7, -0.0625, 0.0625, 100),  # tiny update, the 1/8 range, the most silos
        (20_000, -3.9, 3.9, 4),  # near the value bound
        (3 * PER + 1, 0.0, 0.125, 2),  # one-signed, 1/8 range
        (9_000, -1.0, 0.5, 100),  # lopsided, 100 silos
    ],
)
def test_aggregate_error_stays_within_the_bound_on_untuned_shapes_and_ranges(
    silo_keys, server_keys, size: int, low: float, high: float, silos: int
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: weights from a few examples to the room's share of each silo
    rng = np.random.default_rng(size + silos)
    updates = [rng.uniform(low, high, size=size) for _ in range(silos)]
    limit = silo_keys.config.max_weight_total // silos
    weights = [int(w) for w in rng.integers(1, limit, size=silos)]
    checker = UpdateChecker(server_keys, num_values=size)

    # Execute
    total = aggregate_updates(
        server_keys, [checker.check(u) for u in _sent_all(silo_keys, updates)], weights
    )
    error = np.abs(decrypt_update(silo_keys, total) - np.average(updates, axis=0, weights=weights))

    # Assert: below the bound, so below 1e-6 of any range of 1/8 or more
    assert error.max() <= silo_keys.config.error_bound
    assert error.max() <= 1e-6 * (high - low)


def _sent_all(keys, updates):  # type: ignore[no-untyped-def]
    return [encrypt_update(keys, u) for u in updates]


@given(
    weights=st.lists(st.floats(0.5, 1e7, allow_nan=False), min_size=1, max_size=100),
    limit=st.integers(100, 2**21),
)
def test_integer_weights_fit_the_room_and_keep_the_proportions(
    weights: list[float], limit: int
) -> None:
    # Execute
    applied, divisor = integer_weights(weights, limit=limit)

    # Assert: positive integers within the room; as given (rounded) when they fit
    assert sum(applied) <= limit and all(isinstance(w, int) and w >= 1 for w in applied)
    assert all(
        abs(a - max(1, round(w / divisor))) == 0 for a, w in zip(applied, weights, strict=True)
    )
    if sum(max(1, round(w)) for w in weights) <= limit:
        assert divisor == 1


@pytest.mark.parametrize(
    ("weights", "reason"),
    [([0], "positive integers"), ([1.5], "positive integers"), ([2**21 + 1], "room")],
)
def test_aggregation_refuses_weights_that_are_not_positive_integers_in_the_room(
    silo_keys, server_keys, weights, reason
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    parsed = UpdateChecker(server_keys).check(encrypt_update(silo_keys, np.ones(4)))

    # Execute / Assert
    with pytest.raises(ValueError, match=reason):
        aggregate_updates(server_keys, [parsed], weights)


def test_lenet_sized_update_costs_at_most_12_bytes_per_parameter(silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare: LeNet-5 on 32x32 inputs has 61,706 parameters
    values = np.random.default_rng(1).normal(scale=0.1, size=61706).clip(-4, 4)

    # Execute
    update = encrypt_update(silo_keys, values)
    error = np.abs(decrypt_update(silo_keys, update) - values).max()

    # Assert
    assert update.nbytes / values.size <= 12
    assert error <= 1e-6 * (values.max() - values.min())


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_updates_are_refused_before_encryption(silo_keys, bad: float) -> None:
    # Prepare
    arrays = {"w": np.ones((2, 3), dtype=np.float32), "b": np.array([1.0, bad])}
    flat, layout = flatten(arrays)

    # Execute / Assert
    with pytest.raises(NonFiniteUpdateError, match="index 7, tensor 'b'"):
        encrypt_update(silo_keys, flat, layout=layout)


def test_values_above_the_value_bound_are_refused(silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert: 2^2 is the bound
    encrypt_update(silo_keys, np.full(3, 4.0))
    with pytest.raises(ValueError, match="value_bits"):
        encrypt_update(silo_keys, np.array([0.0, -4.01, 1.0]))


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
    update = encrypt_update(silo_keys, np.ones(5000), layout=layout)

    # Execute
    back = update_from_record(update_to_record(update))

    # Assert
    assert back == update


# ------------------------------------------------------------------ the server's checks
def _key_level(keys) -> bytes:  # type: ignore[no-untyped-def]
    """A ciphertext at SEAL's key level (both primes), not the data level (SEAL encrypts
    nothing there: a zero one)."""
    seal = keys.seal
    ciphertext = sealapi.Ciphertext()
    ciphertext.resize(seal.context, list(seal.context.key_parms_id()), 2)
    return save_object(ciphertext)


@pytest.fixture(scope="session")
def other_parameters():  # type: ignore[no-untyped-def]
    """Keys of the same ring with a 50-bit data prime."""
    return generate_keys(CKKSConfig(coeff_mod_bit_sizes=(50, 40), scale_bits=30))


def _damaged(
    update: EncryptedUpdate, damage: str, foreign: EncryptedUpdate, keys, other
) -> EncryptedUpdate:  # type: ignore[no-untyped-def]
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
        return dataclasses.replace(update, weight=0)
    if damage == "weight above the room":
        return dataclasses.replace(update, weight=2**21 + 1)
    if damage == "weighted by the silo":
        return dataclasses.replace(update, weight=3)
    if damage == "key level":
        chunks[0] = _key_level(keys)
        return dataclasses.replace(update, chunks=tuple(chunks), digests=())
    if damage == "other parameters, own fingerprint claimed":
        chunks[0] = encrypt_update(other, np.ones(PER)).chunks[0]
        return dataclasses.replace(update, chunks=tuple(chunks), digests=())
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
        ("weight above the room", "weight"),
        ("weighted by the silo", "unweighted"),
        ("key level", "at the data level"),
        ("other parameters, own fingerprint claimed", "ciphertext"),
    ],
)
def test_checker_rejects_bad_updates_with_a_reason(
    silo_keys, server_keys, foreign_keys, other_parameters, damage, reason
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    values = np.ones(2 * PER + 5)
    update = encrypt_update(silo_keys, values)
    foreign = encrypt_update(foreign_keys, values)
    checker = UpdateChecker(server_keys, num_values=values.size)
    checker.check(update)  # the undamaged update passes

    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match=reason):
        checker.check(_damaged(update, damage, foreign, silo_keys, other_parameters))


def test_foreign_key_ciphertext_is_silently_summed_by_seal(
    silo_keys, server_keys, foreign_keys
) -> None:  # type: ignore[no-untyped-def]
    """Why fingerprints: same parameters, another key, and SEAL sums it into garbage."""
    # Prepare
    ours = encrypt_update(silo_keys, np.ones(10))
    theirs = dataclasses.replace(
        encrypt_update(foreign_keys, np.ones(10)), fingerprint=silo_keys.fingerprint
    )
    checker = UpdateChecker(server_keys)

    # Execute: every check passes, the sum is made
    total = aggregate_updates(server_keys, [checker.check(ours), checker.check(theirs)], [1, 1])
    decrypted = decrypt_update(silo_keys, total)

    # Assert: no error anywhere, and the mean is far from 1
    assert np.abs(decrypted - 1.0).max() > 1e3


def test_unreadable_header_is_rejected() -> None:
    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match="header"):
        EncryptedUpdate.from_parts(b"{not json", [b""])


@pytest.mark.parametrize("weight", [1.5, "2", True])
def test_a_header_weight_that_is_not_an_integer_is_rejected(silo_keys, weight) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    update = encrypt_update(silo_keys, np.ones(3))
    header = update.header().replace(b'"weight": 1', b'"weight": ' + _json_value(weight))

    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match="integer"):
        EncryptedUpdate.from_parts(header, update.chunks)


def _json_value(value: object) -> bytes:
    return json.dumps(value).encode()
