"""Signed encrypted updates: the signature covers the ciphertext bytes, so a ciphertext
under a foreign key with the federation's fingerprint copied into its header, or a
flipped byte with its sha256 recomputed, is rejected when the server has a registry."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from conftest import FakeGrid, make_reply
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

pytest.importorskip("tenseal")

from fl_lbbsp.crypto import (  # noqa: E402
    CKKSConfig,
    decrypt_update,
    encrypt_update,
    flatten,
    generate_keys,
    write_key_files,
)
from fl_lbbsp.crypto.records import update_from_record, update_to_record  # noqa: E402
from fl_lbbsp.security.identity import SiloRegistry, sign_reply, signed_arrays  # noqa: E402
from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task")

SILOS = {1: "a", 2: "b", 3: "c"}  # node -> silo
CONFIG = CKKSConfig()


@pytest.fixture(scope="module")
def he_keys():  # type: ignore[no-untyped-def]
    return generate_keys(CONFIG)


@pytest.fixture(scope="module")
def public_file(he_keys, tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_key_files(he_keys, tmp_path_factory.mktemp("keys")).public


@pytest.fixture(scope="module")
def signing() -> dict[str, Ed25519PrivateKey]:
    return {silo: Ed25519PrivateKey.generate() for silo in SILOS.values()}


def _content(he_keys, node: int, value: float, n: int) -> tuple[ArrayRecord, dict[str, Any]]:  # type: ignore[no-untyped-def]
    flat, layout = flatten({"w": np.full(3000, value, dtype=np.float32)})
    update = encrypt_update(he_keys, flat, layout=layout)
    metrics = {"num-examples": n, "train-time": 1.0, "batch-size": 16, "he-time": 0.25}
    return update_to_record(update), metrics


def _signed_reply(
    node: int, arrays: ArrayRecord, metrics: dict[str, Any], key, *, signed_arrays_of=None
):  # type: ignore[no-untyped-def]
    """A reply of ``arrays`` signed by ``key`` over ``signed_arrays_of`` (default: the
    arrays sent)."""
    silo = SILOS[node]
    signature = sign_reply(
        key,
        run_id=1,
        server_round=1,
        instruction=None,  # the strategy's messages here were never pushed: no ids
        silo=silo,
        metrics=metrics,
        arrays=signed_arrays(arrays if signed_arrays_of is None else signed_arrays_of),
    )
    content = RecordDict(
        {
            "arrays": arrays,
            "metrics": MetricRecord(metrics),
            "silo": ConfigRecord({"silo-id": silo, "signature": signature}),
        }
    )
    return make_reply(content, node_id=node)


def _forged(damage: str, he_keys) -> ArrayRecord:  # type: ignore[no-untyped-def]
    """Silo c's signed update replaced on its way: a foreign key's ciphertext with the
    federation's fingerprint in its header, or a flipped byte with its sha256 redone."""
    honest = update_from_record(_content(he_keys, 3, 3.0, 600)[0])
    if damage == "foreign key":
        foreign = update_from_record(_content(generate_keys(CONFIG), 3, 3.0, 600)[0])
        forged = dataclasses.replace(foreign, fingerprint=honest.fingerprint)
    else:
        chunk = bytearray(honest.chunks[0])
        chunk[len(chunk) // 2] ^= 0x55
        forged = dataclasses.replace(honest, chunks=(bytes(chunk), *honest.chunks[1:]), digests=())
    return update_to_record(forged)


@pytest.mark.parametrize("damage", ["foreign key", "flipped byte"])
def test_forged_ciphertext_under_a_valid_header_is_rejected_by_its_signature(
    damage: str, he_keys, public_file, signing, tmp_path, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a and b honest; c's signed reply with its ciphertext swapped for a forgery
    registry = SiloRegistry(keys={s: k.public_key() for s, k in signing.items()})
    strategy = EncryptedLBBSPFedAvg(
        public_context=public_file, initial_batch_size=16, local_steps=4, lr=0.05,
        min_train_nodes=3, min_available_nodes=3, silo_registry=registry,
        telemetry_path=tmp_path / "t.jsonl",
    )  # fmt: skip
    zeros = ArrayRecord({"w": Array(np.zeros(3000, dtype=np.float32))})
    strategy.configure_train(1, zeros, ConfigRecord(), FakeGrid(list(SILOS)))
    good = [
        _signed_reply(node, *_content(he_keys, node, value, n), signing[SILOS[node]])
        for node, value, n in ((1, 1.0, 100), (2, 4.0, 100))
    ]
    honest_arrays, metrics = _content(he_keys, 3, 3.0, 600)
    bad = _signed_reply(
        3, _forged(damage, he_keys), metrics, signing["c"], signed_arrays_of=honest_arrays
    )

    # Execute
    arrays, _ = strategy.aggregate_train(1, [*good, bad])

    # Assert: c is out on its signature; the aggregate is a and b's mean (each caps the
    # other at its own size: 100)
    assert arrays is not None
    np.testing.assert_allclose(
        decrypt_update(he_keys, update_from_record(arrays)), np.full(3000, 2.5), atol=1e-6
    )
    records = {id(r): r for r in fl_log.records if r.levelname == "WARNING"}
    lines = [r.getMessage() for r in records.values() if "rejected" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith("round 1: reply of silo c (node 3)") and "bad signature" in lines[0]
