"""Encrypted LB-BSP FedAvg: the same model as plaintext, ciphertexts only on the server,
bad replies left out with a logged reason, he-time in the balancer, NaN refused on silos."""

from __future__ import annotations

import dataclasses
import json
import logging
import math

import numpy as np
import pytest
import torch
from conftest import FakeGrid, make_reply
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

pytest.importorskip("tenseal")

from fl_lbbsp.clients.app import SiloSetup, make_client_app, silo_data  # noqa: E402
from fl_lbbsp.crypto import (  # noqa: E402
    decrypt_update,
    encrypt_update,
    flatten,
    generate_keys,
    load_server_keys,
    load_silo_keys,
    unflatten,
    write_key_files,
)
from fl_lbbsp.crypto.records import (  # noqa: E402
    is_encrypted,
    update_from_record,
    update_to_record,
)
from fl_lbbsp.models import build_model  # noqa: E402
from fl_lbbsp.runs.inprocess import InProcessGrid  # noqa: E402
from fl_lbbsp.strategies import LBBSPFedAvg  # noqa: E402
from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task")

SETTINGS = {
    "initial_batch_size": 16,
    "local_steps": 4,
    "lr": 0.05,
    "min_train_nodes": 3,
    "min_available_nodes": 3,
    "min_evaluate_nodes": 3,
}


@pytest.fixture(scope="module")
def key_files(tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_key_files(generate_keys(), tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="module")
def silo_keys(key_files):  # type: ignore[no-untyped-def]
    return load_silo_keys(key_files.secret)


# ------------------------------------------------------------------ full runs, in process
def _run(setup: SiloSetup, strategy: LBBSPFedAvg, rounds: int = 3):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    data = silo_data(setup, 0)
    model = build_model(setup.model, input_shape=data.input_shape, num_classes=data.num_classes)
    grid = InProcessGrid(make_client_app(setup), num_nodes=setup.num_silos)
    result = strategy.start(
        grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds
    )
    return result, grid


def test_encrypted_three_round_run_ends_with_the_plaintext_model(
    key_files, silo_keys, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: same data, seeds and batch sizes (balancing off, so timing noise cannot
    # change them); dataset sizes differ per silo (Dirichlet), so the weights matter
    plain_setup = SiloSetup(num_silos=3, partition="dirichlet:0.5", evaluate_on="test")
    enc_setup = plain_setup.model_copy(update={"secret_context": str(key_files.secret)})
    plain = LBBSPFedAvg(balance=False, **SETTINGS)
    encrypted = EncryptedLBBSPFedAvg(
        public_context=key_files.public, balance=False, telemetry_path=tmp_path / "t.jsonl",
        **SETTINGS,
    )  # fmt: skip

    # Execute
    plain_result, _ = _run(plain_setup, plain)
    enc_result, grid = _run(enc_setup, encrypted)

    # Assert: the server ends with ciphertexts only; the silos' decryption matches
    assert is_encrypted(enc_result.arrays)
    update = update_from_record(enc_result.arrays)
    decrypted = unflatten(decrypt_update(silo_keys, update), update.layout)
    expected = plain_result.arrays.to_numpy_ndarrays()
    diff = max(
        float(np.abs(decrypted[name] - ref).max())
        for name, ref in zip(plain_result.arrays.keys(), expected, strict=True)
    )
    assert diff <= 1e-4
    assert update.contributors == 3 and update.weight == pytest.approx(1.0)
    train = [t for t in grid.transfers if t.message_type == "train"]
    assert len(train) == 9 and all(t.error is None for t in train)
    assert all(t.reply_bytes > 30 * update.num_values for t in train)  # ciphertext sizes
    # federated evaluation: every round, the silos' test shards
    assert sorted(enc_result.evaluate_metrics_clientapp) == [1, 2, 3]
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [e["round"] for e in events if e["event"] == "evaluate"] == [1, 2, 3]
    he_times = [s["he-time"] for e in events if e["event"] == "train" for s in e["silos"].values()]
    assert len(he_times) == 9 and all(t > 0 for t in he_times)


def test_silo_refuses_nan_update_and_replies_with_an_error(key_files) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a global model full of NaN (refused on receipt since the silos check the
    # model they are sent; with no earlier model to keep, each replies with an error)
    setup = SiloSetup(num_silos=3, secret_context=str(key_files.secret))
    grid = InProcessGrid(make_client_app(setup), num_nodes=3)
    data = silo_data(setup, 0)
    model = build_model("lenet5", input_shape=data.input_shape, num_classes=data.num_classes)
    poisoned = {k: torch.full_like(v, math.nan) for k, v in model.state_dict().items()}
    strategy = EncryptedLBBSPFedAvg(public_context=key_files.public, **SETTINGS)
    messages = strategy.configure_train(1, ArrayRecord(poisoned), ConfigRecord(), grid)

    # Execute
    replies = list(grid.send_and_receive(messages))
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert
    assert all(r.has_error() for r in replies)
    assert all("NaN" in t.error and "global model refused" in t.error for t in grid.transfers)
    assert arrays is None


# ----------------------------------------------------- the strategy on hand-made replies
def _reply(keys, node: int, silo: str, value: float, n: int, total: float, **overrides):  # type: ignore[no-untyped-def]
    flat, layout = flatten({"w": np.full(5000, value, dtype=np.float32)})
    update = encrypt_update(keys, flat, weight=n, total=total, layout=layout, max_contributors=3)
    if overrides:
        update = dataclasses.replace(update, **overrides)
    metrics = MetricRecord(
        {"num-examples": n, "train-time": 1.0, "batch-size": 16, "samples-processed": 64,
         "he-time": 0.25 * node}
    )  # fmt: skip
    content = RecordDict(
        {"arrays": update_to_record(update), "metrics": metrics,
         "silo": ConfigRecord({"silo-id": silo})}
    )  # fmt: skip
    return make_reply(content, node_id=node)


def _strategy(key_files, tmp_path, **kwargs) -> EncryptedLBBSPFedAvg:  # type: ignore[no-untyped-def]
    return EncryptedLBBSPFedAvg(
        public_context=key_files.public, telemetry_path=tmp_path / "t.jsonl",
        **{**SETTINGS, **kwargs},
    )  # fmt: skip


def _initial() -> ArrayRecord:
    return ArrayRecord({"w": Array(np.zeros(5000, dtype=np.float32))})


def _decrypted(keys, arrays: ArrayRecord) -> np.ndarray:  # type: ignore[no-untyped-def]
    return decrypt_update(keys, update_from_record(arrays))


def test_announced_total_is_the_sum_of_known_dataset_sizes(key_files, silo_keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    strategy = _strategy(key_files, tmp_path)
    grid = FakeGrid([1, 2, 3])
    first = list(strategy.configure_train(1, _initial(), ConfigRecord(), grid))
    replies = [
        _reply(silo_keys, node, silo, 1.0, n, total=3.0)
        for node, silo, n in ((1, "a", 100), (2, "b", 300), (3, "c", 600))
    ]
    strategy.aggregate_train(1, replies)

    # Execute
    second = list(strategy.configure_train(2, _initial(), ConfigRecord(), grid))

    # Assert: round 1 knows nothing (S = number of silos), round 2 knows every n_i
    assert {m.content["config"]["he-weight-total"] for m in first} == {3.0}
    assert {m.content["config"]["he-weight-total"] for m in second} == {1000.0}
    assert {m.content["config"]["he-num-silos"] for m in second} == {3}


def test_he_time_is_reported_to_the_balancer_as_fixed_time(key_files, silo_keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    strategy = _strategy(key_files, tmp_path)
    strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid([1, 2, 3]))
    replies = [
        _reply(silo_keys, node, s, 1.0, 10, total=3.0) for node, s in ((1, "a"), (2, "b"), (3, "c"))
    ]

    # Execute
    strategy.aggregate_train(1, replies)

    # Assert: the balancer's fixed cost, and the round time includes encryption
    assert [strategy.balancer.fixed_time(s) for s in "abc"] == [0.25, 0.5, 0.75]
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert [e["round_time"] for e in events if e["event"] == "train"] == [1.75]


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("foreign key", "another key"),
        ("truncated", "bytes"),
        ("corrupted", "corrupted"),
        ("wrong chunk count", "chunks"),
        ("wrong weight", "num-examples / S"),
        ("plaintext", "no encrypted update"),
    ],
)
def test_bad_reply_is_left_out_with_a_logged_reason_and_the_round_goes_on(
    key_files, silo_keys, tmp_path, fl_log, damage, reason
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silos a and b are fine, silo c's reply is damaged
    strategy = _strategy(key_files, tmp_path)
    strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid([1, 2, 3]))
    good = [_reply(silo_keys, 1, "a", 1.0, 100, 3.0), _reply(silo_keys, 2, "b", 4.0, 300, 3.0)]
    bad = _damaged_reply(damage, silo_keys)

    # Execute
    arrays, metrics = strategy.aggregate_train(1, [*good, bad])

    # Assert: the weighted average of a and b only
    assert arrays is not None and metrics is not None
    np.testing.assert_allclose(_decrypted(silo_keys, arrays), np.full(5000, 3.25), atol=1e-5)
    warnings = [r.getMessage() for r in fl_log.records if r.levelno == logging.WARNING]
    assert any("silo c" in w and reason in w and "goes on" in w for w in warnings), warnings
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["event"] == "rejected"]
    assert len(rejected) == 1 and rejected[0]["silo"] == "c" and reason in rejected[0]["reason"]


def _damaged_reply(damage: str, keys):  # type: ignore[no-untyped-def]
    if damage == "foreign key":
        return _reply(generate_keys(), 3, "c", 9.0, 600, 3.0)
    reply = _reply(keys, 3, "c", 9.0, 600, 3.0)
    update = update_from_record(reply.content["arrays"])
    chunks = list(update.chunks)
    if damage == "truncated":
        chunks[0] = chunks[0][:1000]
        update = dataclasses.replace(update, chunks=tuple(chunks), digests=())
    elif damage == "corrupted":
        broken = bytearray(chunks[0])
        broken[4000] ^= 0x55
        update = dataclasses.replace(update, chunks=(bytes(broken), *chunks[1:]))
    elif damage == "wrong chunk count":
        update = dataclasses.replace(update, chunks=(*chunks, chunks[0]), digests=())
    elif damage == "wrong weight":
        update = dataclasses.replace(update, weight=update.weight * 10)
    if damage == "plaintext":
        reply.content["arrays"] = ArrayRecord({"w": Array(np.full(5000, 9.0, dtype=np.float32))})
    else:
        reply.content["arrays"] = update_to_record(update)
    return reply


def test_server_strategy_refuses_the_secret_key(key_files, silo_keys) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert
    with pytest.raises(ValueError, match="secret key"):
        EncryptedLBBSPFedAvg(public_context=silo_keys, **SETTINGS)
    with pytest.raises(ValueError, match="secret key"):
        EncryptedLBBSPFedAvg(public_context=key_files.secret, **SETTINGS)
    strategy = EncryptedLBBSPFedAvg(public_context=key_files.public.parent, **SETTINGS)
    assert strategy.he_keys.context.is_private() is False
    assert load_server_keys(key_files.public).fingerprint == strategy.he_keys.fingerprint
