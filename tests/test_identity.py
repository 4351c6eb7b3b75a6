"""Silo identity: signed replies checked against the silo registry (impostors, forgeries,
replays), ``fl-lbbsp keys silos``, and a silo refusing a bad global model."""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
import pytest
import torch
from conftest import FakeGrid, make_reply
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)

from fl_lbbsp.cli import main
from fl_lbbsp.clients.app import SiloSetup, _checked_model, make_client_app, silo_data
from fl_lbbsp.clients.cluster import WorkerSetup, make_worker_app, worker_data
from fl_lbbsp.contract import LAST_MODEL
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.security.identity import (
    IdentityError,
    SiloRegistry,
    load_registry,
    load_signing_key,
    sign_reply,
    signed_arrays,
    signed_bytes,
)
from fl_lbbsp.security.silo_keys import write_silo_keys
from fl_lbbsp.strategies import LBBSPCluster, LBBSPFedAvg

pytestmark = pytest.mark.usefixtures("flower_task")

NODES = (11, 12, 13)  # silos a, b, c
SILOS = ("a", "b", "c")
RUN = 1  # the run id of the flower_task fixture


# ------------------------------------------------------------------------ helpers
@pytest.fixture(scope="module")
def silo_keys() -> dict[str, Ed25519PrivateKey]:
    return {silo: Ed25519PrivateKey.generate() for silo in SILOS}


def _registry(keys: dict[str, Ed25519PrivateKey]) -> SiloRegistry:
    return SiloRegistry(keys={silo: key.public_key() for silo, key in keys.items()})


def _reply(
    node: int,
    silo: str,
    *,
    key: Ed25519PrivateKey | None,
    value: float = 1.0,
    server_round: int = 1,
    run_id: int = RUN,
    num_examples: int = 100,
    edit: dict[str, Any] | None = None,
) -> Any:
    """A train reply from ``node`` claiming ``silo``, signed with ``key`` for
    ``run_id`` and ``server_round`` (``None``: unsigned); ``edit`` changes its metrics
    after signing."""
    arrays = ArrayRecord({"w": Array(np.full(3, value, dtype=np.float32))})
    metrics = {"num-examples": num_examples, "train-time": 1.0, "batch-size": 32}
    silo_record = ConfigRecord({"silo-id": silo})
    if key is not None:
        silo_record["signature"] = sign_reply(
            key,
            run_id=run_id,
            server_round=server_round,
            instruction=None,  # the strategy's messages here were never pushed: no ids
            silo=silo,
            metrics=metrics,
            arrays=signed_arrays(arrays),
        )
    content = RecordDict(
        {
            "arrays": arrays,
            "metrics": MetricRecord({**metrics, **(edit or {})}),
            "silo": silo_record,
        }
    )
    return make_reply(content, node_id=node)


def _strategy(tmp_path, **kwargs: Any) -> LBBSPFedAvg:  # type: ignore[no-untyped-def]
    strategy = LBBSPFedAvg(
        initial_batch_size=32,
        local_steps=10,
        lr=0.01,
        min_train_nodes=3,
        min_available_nodes=3,
        telemetry_path=tmp_path / "t.jsonl",
        **kwargs,
    )
    zeros = ArrayRecord({"w": Array(np.zeros(3, dtype=np.float32))})
    strategy.configure_train(1, zeros, ConfigRecord(), FakeGrid(list(NODES)))
    return strategy


def _warnings(fl_log) -> list[str]:  # type: ignore[no-untyped-def]
    """Each warning once (fl_log's handler may see a record twice: on the fl_lbbsp logger
    and, propagated, on the root logger)."""
    records = {id(r): r for r in fl_log.records if r.levelname == "WARNING"}
    return [r.getMessage() for r in records.values()]


def _rejected(tmp_path) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    events = map(json.loads, (tmp_path / "t.jsonl").read_text().splitlines())
    return [e for e in events if e["event"] == "rejected"]


# ------------------------------------------------------------------- the server side
def test_impostor_replying_first_is_rejected_and_the_honest_silo_accepted(
    silo_keys, tmp_path, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: node 13 claims to be silo a with its own key and a huge update, first
    strategy = _strategy(tmp_path, silo_registry=_registry(silo_keys))
    impostor = _reply(13, "a", key=silo_keys["c"], value=100.0)
    honest = [_reply(n, s, key=silo_keys[s]) for n, s in zip(NODES[:2], SILOS[:2], strict=True)]

    # Execute
    arrays, _ = strategy.aggregate_train(1, [impostor, *honest])

    # Assert: the impostor is out, a and b count, with the honest mean
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"].numpy(), np.ones(3))
    rejected = _rejected(tmp_path)
    assert [(e["silo"], e["node"]) for e in rejected] == [("a", 13)]
    assert "bad signature" in rejected[0]["reason"]
    lines = [w for w in _warnings(fl_log) if "rejected" in w]
    assert len(lines) == 1 and lines[0].startswith("round 1: reply of silo a (node 13)")


def test_a_registrys_declared_dataset_size_bounds_a_signed_claim(silo_keys, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the registry declares silo a's dataset at 100 samples; a's signed reply
    # claims 10^6 (a registered silo that lies about its size)
    registry = SiloRegistry(
        keys={silo: key.public_key() for silo, key in silo_keys.items()},
        dataset_sizes={"a": 100},
    )
    strategy = _strategy(tmp_path, silo_registry=registry)
    grab = _reply(11, "a", key=silo_keys["a"], value=100.0, num_examples=10**6)
    honest = [_reply(n, s, key=silo_keys[s]) for n, s in zip(NODES[1:], SILOS[1:], strict=True)]

    # Execute
    arrays, _ = strategy.aggregate_train(1, [grab, *honest])

    # Assert: the signature holds, but the claim contradicts the declared size: a's update
    # is left out and b and c make the mean
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"].numpy(), np.ones(3))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"key": None}, "unsigned reply"),
        ({"key": "other"}, "bad signature"),
        ({"server_round": 2}, "bad signature"),
        ({"run_id": 7}, "bad signature"),
        ({"edit": {"num-examples": 10**6}}, "bad signature"),
        ({"silo": "z"}, "not in the silo registry"),
    ],
    ids=["unsigned", "mis-signed", "other round", "other run", "edited", "unregistered"],
)
def test_unsigned_forged_and_replayed_replies_are_rejected(
    change: dict[str, Any], reason: str, silo_keys, tmp_path, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a and b honest; c's reply altered one way
    strategy = _strategy(tmp_path, silo_registry=_registry(silo_keys))
    options: dict[str, Any] = {"key": silo_keys["c"], **change}
    options["key"] = silo_keys["a"] if options["key"] == "other" else options["key"]
    silo = options.pop("silo", "c")
    bad = _reply(13, silo, value=50.0, **options)
    good = [_reply(n, s, key=silo_keys[s]) for n, s in zip(NODES[:2], SILOS[:2], strict=True)]

    # Execute
    arrays, _ = strategy.aggregate_train(1, [*good, bad])

    # Assert: one line naming round, silo and reason; the aggregate without it
    assert arrays is not None
    np.testing.assert_allclose(arrays["w"].numpy(), np.ones(3))
    lines = [w for w in _warnings(fl_log) if "rejected" in w]
    assert len(lines) == 1
    assert lines[0].startswith(f"round 1: reply of silo {silo} (node 13) rejected")
    assert reason in lines[0]


def test_without_a_registry_one_warning_and_replies_are_believed(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare / Execute
    strategy = _strategy(tmp_path)
    replies = [_reply(n, s, key=None) for n, s in zip(NODES, SILOS, strict=True)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None
    strategy.configure_train(2, arrays, ConfigRecord(), FakeGrid(list(NODES)))

    # Assert: one warning in all, when the first round was planned
    unverified = [w for w in _warnings(fl_log) if "unverified" in w]
    assert len(unverified) == 1
    assert arrays is not None and not _rejected(tmp_path)


def test_the_registry_file_of_keys_silos_verifies_what_the_key_files_sign(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Execute
    code = main(["keys", "silos", "--silos", "3", "--out", str(tmp_path), "--dataset-sizes",
                 "600,450,300"])  # fmt: skip

    # Assert: private keys 0600, the registry holds the public keys and sizes
    assert code == 0 and "registry.json" in capsys.readouterr().out
    registry = load_registry(tmp_path)
    assert sorted(registry.keys) == ["0", "1", "2"]
    assert dict(registry.dataset_sizes) == {"0": 600, "1": 450, "2": 300}
    assert (tmp_path / "silo-1.key").stat().st_mode & 0o777 == 0o600
    fields: dict[str, Any] = {"run_id": 4, "server_round": 2, "instruction": "m1", "silo": "1",
                              "metrics": {"x": 1}, "arrays": [("w", b"abc")]}  # fmt: skip
    registry.verify(sign_reply(load_signing_key(tmp_path / "silo-1.key"), **fields), **fields)
    with pytest.raises(ValueError, match="bad signature"):
        registry.verify(sign_reply(load_signing_key(tmp_path / "silo-2.key"), **fields), **fields)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--silos", "0"], "--silos must be positive"),
        ([], "exactly one of --silos"),
        (["--silos", "2", "--dataset-sizes", "10"], "one positive size per silo"),
        (["--silos", "2", "--dataset-sizes", "10,x"], "--dataset-sizes"),
        (["--ids", "a,a"], "distinct"),
    ],
)
def test_keys_silos_errors_exit_2_with_one_line(
    argv: list[str], message: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(["keys", "silos", "--out", str(tmp_path / "k"), *argv])

    # Assert
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert message in err and len(err.strip().splitlines()) == 1


def test_keys_silos_keeps_existing_keys_without_force(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    main(["keys", "silos", "--silos", "1", "--out", str(tmp_path)])
    before = (tmp_path / "silo-0.key").read_bytes()

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(["keys", "silos", "--silos", "1", "--out", str(tmp_path)])

    # Assert
    assert exit_info.value.code == 2 and "--force" in capsys.readouterr().err
    assert (tmp_path / "silo-0.key").read_bytes() == before


@pytest.mark.parametrize(
    "content",
    [{}, {"silos": {"a": {}}}, {"silos": {"a": {"public-key": "junk"}}}],
    ids=["empty", "no key", "not PEM"],
)
def test_a_bad_registry_is_refused_at_construction(content: dict[str, Any], tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Execute / Assert
    with pytest.raises(IdentityError):
        LBBSPFedAvg(initial_batch_size=8, local_steps=1, lr=0.1, silo_registry=content)


def test_signed_bytes_cover_every_field() -> None:
    # Prepare
    arrays = [("w", b"\x00\x01")]
    base: dict[str, Any] = {
        "run_id": 1, "server_round": 1, "instruction": "m1", "silo": "a",
        "metrics": {"n": 1, "t": 0.5}, "arrays": arrays,
    }  # fmt: skip
    changes = [{"run_id": 2}, {"server_round": 2}, {"instruction": "m2"}, {"instruction": None},
               {"silo": "b"}, {"metrics": {"n": 2, "t": 0.5}},
               {"arrays": [("w", b"\x00\x02")]}, {"arrays": [("v", b"\x00\x01")]}]  # fmt: skip

    # Execute
    signed = {signed_bytes(**base), *(signed_bytes(**{**base, **c}) for c in changes)}

    # Assert: metric order does not matter, every field does
    assert len(signed) == len(changes) + 1
    assert signed_bytes(**{**base, "metrics": {"t": 0.5, "n": 1}}) == signed_bytes(**base)


# ---------------------------------------------------------------------- the silo side
def _context(last: dict[str, torch.Tensor] | None) -> Context:
    state = RecordDict({} if last is None else {LAST_MODEL: ArrayRecord(last)})
    return Context(run_id=1, node_id=1, node_config={}, state=state, run_config={})


@pytest.mark.parametrize(
    ("received", "reason"),
    [(math.nan, "NaN or inf"), (1e6, "not within 10x"), (1e-6, "not within 10x")],
    ids=["NaN", "huge", "vanishing"],
)
def test_silo_refuses_a_bad_global_model_and_keeps_its_own(
    received: float, reason: str, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the silo's last model is all ones
    last = {"w": torch.ones(4), "b": torch.ones(2)}
    bad = {"w": torch.full((4,), received), "b": torch.full((2,), received)}

    # Execute
    state, refused = _checked_model(bad, _context(last), 10.0)

    # Assert: the last model is kept, with one warning naming the reason
    assert refused is not None and reason in refused
    torch.testing.assert_close(state["w"], last["w"])
    lines = [w for w in _warnings(fl_log) if "refused" in w]
    assert len(lines) == 1 and reason in lines[0]


def test_silo_accepts_a_model_within_the_factor_and_a_first_model() -> None:
    # Prepare
    last = {"w": torch.ones(4)}
    near = {"w": torch.full((4,), 3.0)}

    # Execute
    kept, refused = _checked_model(near, _context(last), 10.0)
    first, refused_first = _checked_model({"w": torch.full((4,), 1e6)}, _context(None), 10.0)

    # Assert
    assert refused is None and kept is near
    assert refused_first is None and float(first["w"][0]) == 1e6


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--silo-registry", "/no/such/keys"], "not a readable silo registry"),
        (["--silo-registry", "KEYS", "--silos", "3"], "silo 2 is not in the silo registry"),
    ],
)
def test_simulate_with_a_bad_silo_registry_exits_2_with_one_line(
    argv: list[str], message: str, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a key folder of two silos
    write_silo_keys(tmp_path / "keys", ["0", "1"])
    argv = [str(tmp_path / "keys") if a == "KEYS" else a for a in argv]

    # Execute
    with pytest.raises(SystemExit) as exit_info:
        main(["simulate", "--in-process", "--out", str(tmp_path / "out"), *argv])

    # Assert
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("fl-lbbsp: error: --silo-registry:") and message in err
    assert len(err.strip().splitlines()) == 1


def test_silo_apps_sign_and_the_server_accepts_every_reply(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: three in-process silos with keys from one folder, the server its registry
    write_silo_keys(tmp_path / "keys", ["0", "1", "2"])
    setup = SiloSetup(num_silos=3, model="mlp", signing_key=str(tmp_path / "keys"))
    grid = InProcessGrid(make_client_app(setup), num_nodes=3)
    data = silo_data(setup, 0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    strategy = LBBSPFedAvg(
        initial_batch_size=8, local_steps=2, lr=0.05, min_train_nodes=3, min_available_nodes=3,
        fraction_evaluate=0.0, silo_registry=tmp_path / "keys" / "registry.json",
        telemetry_path=tmp_path / "t.jsonl",
    )  # fmt: skip

    # Execute
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)

    # Assert: two rounds of three signed replies, none rejected, no identity warning
    assert sorted(result.train_metrics_clientapp) == [1, 2]
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    rounds = [e for e in events if e["event"] == "train"]
    assert [sorted(e["silos"]) for e in rounds] == [["0", "1", "2"]] * 2
    assert not [e for e in events if e["event"] == "rejected"]
    assert not [w for w in _warnings(fl_log) if "unverified" in w or "rejected" in w]


def test_cluster_workers_sign_and_the_server_accepts_every_reply(tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Prepare: three in-process workers with keys from one folder, the server its registry
    write_silo_keys(tmp_path / "keys", ["0", "1", "2"])
    setup = WorkerSetup(num_workers=3, model="mlp", signing_key=str(tmp_path / "keys"))
    grid = InProcessGrid(make_worker_app(setup), num_nodes=3)
    data = worker_data(setup, 0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    strategy = LBBSPCluster(
        initial_batch_size=8, lr=0.05, min_train_nodes=3, min_available_nodes=3,
        silo_registry=tmp_path / "keys", telemetry_path=tmp_path / "t.jsonl",
    )  # fmt: skip

    # Execute
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)

    # Assert: two iterations of three signed replies, none rejected
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    rounds = [e for e in events if e["event"] == "train"]
    assert [sorted(e["silos"]) for e in rounds] == [["0", "1", "2"]] * 2
    assert not [w for w in _warnings(fl_log) if "unverified" in w or "rejected" in w]


class _ReplayingGrid(InProcessGrid):
    """An in-process grid where node ``thief`` (authenticated as itself) answers its own
    instruction with a copy of node ``victim``'s signed reply of the same round, and gets
    it in first."""

    def __init__(self, *args: Any, thief: int, victim: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.thief, self.victim = thief, victim
        self.sent: dict[int, Message] = {}

    def push_messages(self, messages: Any) -> Any:
        messages = list(messages)
        self.sent.update({m.metadata.dst_node_id: m for m in messages})
        return super().push_messages(messages)

    def pull_messages(self, message_ids: Any) -> Any:
        replies = list(super().pull_messages(message_ids))
        source = {m.metadata.src_node_id: m for m in replies}
        if self.victim not in source or self.thief not in source:
            return replies
        copied = Message(content=source[self.victim].content, reply_to=self.sent[self.thief])
        return [copied, *(m for m in replies if m.metadata.src_node_id != self.thief)]


def test_a_signed_reply_replayed_by_another_node_in_the_same_round_is_rejected(
    tmp_path, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: three signing silos; node 102 replays node 100's (silo 0's) reply, first
    write_silo_keys(tmp_path / "keys", ["0", "1", "2"])
    setup = SiloSetup(num_silos=3, model="mlp", signing_key=str(tmp_path / "keys"))
    grid = _ReplayingGrid(make_client_app(setup), num_nodes=3, thief=102, victim=100)
    data = silo_data(setup, 0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    strategy = LBBSPFedAvg(
        initial_batch_size=8, local_steps=2, lr=0.05, min_train_nodes=2, min_available_nodes=3,
        fraction_evaluate=0.0, silo_registry=tmp_path / "keys", telemetry_path=tmp_path / "t.jsonl",
    )  # fmt: skip
    assert sorted(grid.get_node_ids()) == [100, 101, 102]  # silos 0, 1, 2

    # Execute
    strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)

    # Assert: every round the copy is rejected as signed for another instruction, and
    # the honest silo 0 is not shut out by it
    events = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    rejected = [e for e in events if e["event"] == "rejected"]
    assert [(e["round"], e["node"], e["silo"]) for e in rejected] == [(1, 102, "0"), (2, 102, "0")]
    assert all("bad signature" in e["reason"] for e in rejected)
    trains = [e for e in events if e["event"] == "train"]
    assert [sorted(e["silos"]) for e in trains] == [["0", "1"]] * 2
