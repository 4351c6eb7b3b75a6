"""Encrypted LB-BSP FedAvg: the same model as plaintext, ciphertexts only on the server,
the server's capped weights applied to the ciphertexts, bad replies left out with a logged
reason, he-time in the balancer, NaN refused on silos."""

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
    # FedAvg's mean: the server cannot clip ciphertexts, so the plaintext twin does not
    plain = LBBSPFedAvg(balance=False, robust_aggregation="mean", **SETTINGS)
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
    sizes = [
        s["num-examples"] for e in _events(tmp_path) if e["event"] == "train" for s in
        e["silos"].values()
    ][-3:]  # fmt: skip
    assert update.contributors == 3 and update.aggregate and update.weight == sum(sizes)
    train = [t for t in grid.transfers if t.message_type == "train"]
    assert len(train) == 9 and all(t.error is None for t in train)
    # seeded ciphertexts: at most 12 bytes per parameter up, an aggregate's twice down
    assert all(7.5 * update.num_values < t.reply_bytes < 12 * update.num_values for t in train)
    assert all(t.sent_bytes > 15 * update.num_values for t in train[3:])
    # federated evaluation: every round, the silos' test shards
    assert sorted(enc_result.evaluate_metrics_clientapp) == [1, 2, 3]
    events = _events(tmp_path)
    assert [e["round"] for e in events if e["event"] == "evaluate"] == [1, 2, 3]
    he_times = [s["he-time"] for e in events if e["event"] == "train" for s in e["silos"].values()]
    assert len(he_times) == 9 and all(t > 0 for t in he_times)


def test_an_encrypted_silos_interval_spans_its_train_and_he_time(key_files) -> None:  # type: ignore[no-untyped-def]
    # Prepare: emulated silos 1x, 2x, 3x slower (their encryption too): the claim check
    # judges train-time + he-time against each reply's own compute interval
    setup = SiloSetup(num_silos=3, secret_context=str(key_files.secret), slowdowns=("1", "2", "3"))
    grid = InProcessGrid(make_client_app(setup), num_nodes=3)
    data = silo_data(setup, 0)
    model = build_model("lenet5", input_shape=data.input_shape, num_classes=data.num_classes)
    strategy = EncryptedLBBSPFedAvg(public_context=key_files.public, **SETTINGS)
    messages = strategy.configure_train(1, ArrayRecord(model.state_dict()), ConfigRecord(), grid)

    # Execute
    replies = list(grid.send_and_receive(messages))

    # Assert: each interval is at least what the silo claims (an honest claim is not
    # above what the server can observe of it), encryption included
    for reply in replies:
        metrics = reply.content.metric_records["metrics"]
        claimed = float(metrics["train-time"]) + float(metrics["he-time"])  # type: ignore[arg-type]
        interval = float(metrics["compute-end"]) - float(metrics["compute-start"])  # type: ignore[arg-type]
        assert float(metrics["he-time"]) > 0 and interval >= claimed  # type: ignore[arg-type]


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


def _events(tmp_path) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    return [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]


# ----------------------------------------------------- the strategy on hand-made replies
def _reply(keys, node: int, silo: str, value: float, n: int, **overrides):  # type: ignore[no-untyped-def]
    """Silo ``silo``'s reply: its model (5000 times ``value``) encrypted under ``keys``,
    in plaintext if ``keys`` is None, and ``num-examples`` n."""
    model = {"w": np.full(5000, value, dtype=np.float32)}
    if keys is None:
        arrays = ArrayRecord({"w": Array(model["w"])})
    else:
        flat, layout = flatten(model)
        update = encrypt_update(keys, flat, layout=layout)
        if overrides:
            update = dataclasses.replace(update, **overrides)
        arrays = update_to_record(update)
    metrics = MetricRecord(
        {"num-examples": n, "train-time": 1.0, "batch-size": 16, "samples-processed": 64,
         "he-time": 0.25 * node}
    )  # fmt: skip
    content = RecordDict(
        {"arrays": arrays, "metrics": metrics, "silo": ConfigRecord({"silo-id": silo})}
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


def test_silos_are_sent_no_weight_total(key_files, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Execute
    strategy = _strategy(key_files, tmp_path)
    messages = list(strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid([1, 2, 3])))

    # Assert: silos encrypt unweighted updates; there is nothing to scale them by
    assert all("he-weight-total" not in m.content["config"] for m in messages)


@pytest.mark.parametrize(
    ("claims", "values", "weights"),
    [
        ((100, 300, 350), (0.5, 2.0, 3.5), (100, 300, 350)),  # honest: as claimed
        ((100, 300, 50_000), (0.5, 2.0, 3.5), (100, 300, 400)),  # a grab: all the others
        ((120, 90_000, 140, 100), (1.0, 3.0, 2.0, -1.0), (120, 260, 140, 100)),
        # two colluders of 5 claiming 9.9e6: 2x the median each, 4/7 of the weight
        (
            (100, 100, 100, 9_900_000, 9_900_000),
            (0.5, 1.0, 1.5, -3.0, -3.0),
            (100, 100, 100, 200, 200),
        ),
    ],
    ids=["honest", "grab", "grab-among-four", "two-colluders-of-five"],
)
def test_the_server_applies_the_capped_weights_to_the_ciphertexts_as_in_plaintext(
    key_files, silo_keys, tmp_path, fl_log, claims, values, weights
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the same replies, encrypted to the encrypted strategy, in plaintext to
    # the plaintext one
    nodes = list(range(1, len(claims) + 1))
    silos = "abcde"[: len(claims)]
    encrypted = _strategy(key_files, tmp_path)
    # FedAvg's mean in plaintext: the server cannot clip ciphertexts
    plain = LBBSPFedAvg(
        **{**SETTINGS, "min_train_nodes": len(claims), "robust_aggregation": "mean"}
    )
    for strategy in (encrypted, plain):
        strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid(nodes))

    def replies(keys):  # type: ignore[no-untyped-def]
        return [
            _reply(keys, node, silo, value, n)
            for node, silo, value, n in zip(nodes, silos, values, claims, strict=True)
        ]

    # Execute
    arrays, _ = encrypted.aggregate_train(1, replies(silo_keys))
    plain_arrays, _ = plain.aggregate_train(1, replies(None))

    # Assert: the decrypted aggregate is the capped-weight mean, as in plaintext; the
    # weight the server logs is the weight it applied, and W is their sum
    assert arrays is not None and plain_arrays is not None
    expected = np.average(values, weights=weights)
    decrypted = _decrypted(silo_keys, arrays)
    np.testing.assert_allclose(decrypted, expected, atol=1e-6)
    np.testing.assert_allclose(decrypted, plain_arrays["w"].numpy(), atol=1e-6)
    assert update_from_record(arrays).weight == sum(weights) == sum(encrypted.updates.applied)
    capped = {s: w for s, w, n in zip(silos, weights, claims, strict=True) if w != n}
    logged = {r.getMessage() for r in fl_log.records if "weighs as" in r.getMessage()}
    assert {line.split(":")[1].strip() for line in logged} == {f"silo {s}" for s in capped}
    assert all(any(f"weighs as {w:g}" in line for line in logged) for w in capped.values())


def test_a_silo_claiming_50000_examples_weighs_no_more_than_the_cap(
    key_files, silo_keys, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: 19 silos' models at 0 with 100 examples each, one at 1 claiming 50,000:
    # the cap is 2 x the federation's median, 200 (the others hold 1900)
    nodes = list(range(1, 21))
    strategy = _strategy(key_files, tmp_path, min_train_nodes=20, min_available_nodes=20)
    strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid(nodes))
    replies = [_reply(silo_keys, n, f"s{n}", 0.0, 100) for n in nodes[:-1]]
    replies.append(_reply(silo_keys, 20, "liar", 1.0, 50_000))

    # Execute
    arrays, _ = strategy.aggregate_train(1, replies)

    # Assert: its share is 200 / (1900 + 200), not 50000 / 51900
    assert arrays is not None
    np.testing.assert_allclose(_decrypted(silo_keys, arrays), 200 / 2100, atol=1e-6)
    assert update_from_record(arrays).weight == 2100


def test_he_time_is_reported_to_the_balancer_as_fixed_time(key_files, silo_keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    strategy = _strategy(key_files, tmp_path)
    strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid([1, 2, 3]))
    replies = [_reply(silo_keys, node, s, 1.0, 10) for node, s in ((1, "a"), (2, "b"), (3, "c"))]

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
        ("weighted by the silo", "unweighted"),
        ("an aggregate", "aggregate"),
        ("plaintext", "no encrypted update"),
    ],
)
def test_bad_reply_is_left_out_with_a_logged_reason_and_the_round_goes_on(
    key_files, silo_keys, tmp_path, fl_log, damage, reason
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silos a and b are fine, silo c's reply is damaged
    strategy = _strategy(key_files, tmp_path)
    strategy.configure_train(1, _initial(), ConfigRecord(), FakeGrid([1, 2, 3]))
    good = [_reply(silo_keys, 1, "a", 1.0, 100), _reply(silo_keys, 2, "b", 4.0, 100)]
    bad = _damaged_reply(damage, silo_keys)

    # Execute
    arrays, metrics = strategy.aggregate_train(1, [*good, bad])

    # Assert: the average of a and b only
    assert arrays is not None and metrics is not None
    np.testing.assert_allclose(_decrypted(silo_keys, arrays), np.full(5000, 2.5), atol=1e-6)
    warnings = [r.getMessage() for r in fl_log.records if r.levelno == logging.WARNING]
    assert any("silo c" in w and reason in w and "goes on" in w for w in warnings), warnings
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["event"] == "rejected"]
    assert len(rejected) == 1 and rejected[0]["silo"] == "c" and reason in rejected[0]["reason"]


def _damaged_reply(damage: str, keys):  # type: ignore[no-untyped-def]
    if damage == "foreign key":
        return _reply(generate_keys(), 3, "c", 3.0, 600)
    reply = _reply(keys, 3, "c", 3.0, 600)
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
    elif damage == "weighted by the silo":
        update = dataclasses.replace(update, weight=600)
    elif damage == "an aggregate":
        update = dataclasses.replace(update, weight=600, aggregate=True)
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
