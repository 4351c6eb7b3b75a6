"""Encrypted mode: the silo whose signed contribution spoils an aggregate is named.

A registered silo forges its CKKS contribution (values as large as the scheme carries, or
a ciphertext under another key, which decrypts to noise over the whole range) and signs it
with its own key. The silos refuse the aggregate, the server rolls back, the next round's
silos that refused check each contribution (two per contribution, never its sender's), and
the forger is named, left out, and cannot frame an honest silo with its own checks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

pytest.importorskip("tenseal")

import tenseal.sealapi as sealapi  # noqa: E402

from fl_lbbsp.clients.app import SiloSetup, make_client_app, silo_data, train_reply  # noqa: E402
from fl_lbbsp.crypto import (  # noqa: E402
    CKKSConfig,
    InvalidUpdateError,
    decrypt_update,
    encrypt_update,
    flatten,
    generate_keys,
    load_silo_keys,
    write_key_files,
)
from fl_lbbsp.crypto.blame import (  # noqa: E402
    CheckReport,
    CheckRequest,
    assign_checkers,
    judge_checks,
)
from fl_lbbsp.crypto.records import (  # noqa: E402
    check_report_of,
    check_requests_of,
    request_records,
    update_from_record,
    update_to_record,
    with_check_report,
)
from fl_lbbsp.crypto.seal import save_object  # noqa: E402
from fl_lbbsp.models import build_model  # noqa: E402
from fl_lbbsp.runs.inprocess import InProcessGrid  # noqa: E402
from fl_lbbsp.security.identity import signed_arrays  # noqa: E402
from fl_lbbsp.security.silo_keys import write_silo_keys  # noqa: E402
from fl_lbbsp.strategies.config import InvalidSettingError  # noqa: E402
from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg  # noqa: E402

pytestmark = pytest.mark.usefixtures("flower_task")

CONFIG = CKKSConfig()
FORGER = "2"
SETTINGS = {
    "initial_batch_size": 16,
    "local_steps": 2,
    "lr": 0.05,
    "min_train_nodes": 3,
    "min_available_nodes": 3,
    "fraction_evaluate": 0.0,
    "balance": False,
}


@pytest.fixture(scope="module")
def he_keys():  # type: ignore[no-untyped-def]
    return generate_keys(CONFIG)


@pytest.fixture(scope="module")
def key_files(he_keys, tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_key_files(he_keys, tmp_path_factory.mktemp("ckks"))


@pytest.fixture(scope="module")
def silo_keys(tmp_path_factory):  # type: ignore[no-untyped-def]
    return write_silo_keys(tmp_path_factory.mktemp("silos"), ["0", "1", "2"])


def _lines(fl_log, level: int) -> list[str]:  # type: ignore[no-untyped-def]
    """The fl_lbbsp log lines at ``level`` or above, each once."""
    records = {id(r): r for r in fl_log.records if r.levelno >= level}
    return [r.getMessage() for r in records.values()]


# ------------------------------------------------------------------------ the forger
def _forged(forgery: str, record: ArrayRecord, keys) -> ArrayRecord:  # type: ignore[no-untyped-def]
    """``record`` (an honest encrypted update) with its ciphertexts replaced, its header
    and check report kept: values of 1e6, far above the bound honest silos keep to (the
    scale's range ends near 8e6: 1e30 cannot be encoded), or a ciphertext under another
    key (noise over the whole range)."""
    update = update_from_record(record)
    count = len(update.chunks)
    if forgery == "huge":
        chunks = tuple(_seal_chunk(keys, 1e6) for _ in range(count))
    else:
        foreign = generate_keys(CONFIG)
        chunks = tuple(_seal_chunk(foreign, 0.1) for _ in range(count))
    forged = update_to_record(dataclasses.replace(update, chunks=chunks, digests=()))
    report = check_report_of(record)
    return forged if report is None else with_check_report(forged, report)


def _seal_chunk(keys, value: float) -> bytes:  # type: ignore[no-untyped-def]
    """A seeded ciphertext of ``value`` in every slot, made with SEAL directly (no bound)."""
    seal = keys.seal
    plain = sealapi.Plaintext()
    seal.encoder.encode(
        [complex(value, value)] * keys.config.slots, seal.parms_id, keys.config.scale, plain
    )
    return save_object(seal.encryptor.encrypt_symmetric(plain))


def _framing(record: ArrayRecord) -> ArrayRecord:
    """The forger's check report, lying: every contribution it checked is 1e12."""
    report = check_report_of(record)
    if report is None:
        return record
    lies = CheckReport(
        bad_round=report.bad_round,
        reference=report.reference,
        norms=dict.fromkeys(report.norms, 1e12),
    )
    return with_check_report(record, lies)


def _app(setup: SiloSetup, forgery: str, keys, *, from_round: int = 2) -> ClientApp:  # type: ignore[no-untyped-def]
    """The bundled silo app; silo 2 forges its contribution from ``from_round`` on (and
    lies in its checks), signing what it sends with its own key."""
    honest = make_client_app(setup)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        reply = honest(msg, context)
        server_round = int(msg.content["config"]["server-round"])  # type: ignore[arg-type]
        silo = str(context.node_config["partition-id"])
        if forgery == "honest" or silo != FORGER or server_round < from_round or reply.has_error():
            return reply
        arrays = _framing(_forged(forgery, reply.content["arrays"], keys))
        notes = {
            k: str(v) for k, v in reply.content["silo"].items() if k not in ("silo-id", "signature")
        }
        return train_reply(
            msg,
            arrays=arrays,
            metrics=reply.content["metrics"],
            keys=setup.keys,
            silo_id=silo,
            signing_key=setup.signing_key,
            notes=notes,
        )

    return app


def _run(key_files, silo_keys, tmp_path, forgery: str, *, rounds: int = 5, **silo_settings: Any):  # type: ignore[no-untyped-def]
    setup = SiloSetup(
        num_silos=3,
        model="mlp",
        secret_context=str(key_files.secret),
        signing_key=str(silo_keys.registry.parent),
        **silo_settings,
    )
    keys = load_silo_keys(key_files.secret)
    torch.manual_seed(0)
    data = silo_data(setup, 0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    strategy = EncryptedLBBSPFedAvg(
        public_context=key_files.public,
        silo_registry=silo_keys.registry,
        telemetry_path=tmp_path / "t.jsonl",
        **SETTINGS,
    )
    grid = InProcessGrid(_app(setup, forgery, keys), num_nodes=3)
    initial = ArrayRecord(model.state_dict())
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds)
    events = [json.loads(line) for line in (tmp_path / "t.jsonl").read_text().splitlines()]
    start = np.concatenate([a.ravel() for a in initial.to_numpy_ndarrays()])
    return result, events, keys, float(np.linalg.norm(start))


@pytest.mark.parametrize("forgery", ["huge", "garbage"])
def test_a_silo_forging_its_signed_contribution_is_named_and_left_out(
    forgery: str, key_files, silo_keys, tmp_path, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare / Execute: silo 2 forges from round 2 (and lies in every check it makes)
    result, events, keys, start_norm = _run(key_files, silo_keys, tmp_path, forgery)
    final = update_from_record(result.arrays)
    values = decrypt_update(keys, final)

    # Assert: round 3 refuses round 2's aggregate and rolls back; round 4 names silo 2
    errors = _lines(fl_log, logging.ERROR)
    assert any(e.startswith("round 3: most silos refused the global model") for e in errors)
    named = [e for e in errors if "is named" in e]
    assert len(named) == 1 and named[0].startswith(f"round 4: silo {FORGER} is named")
    assert "spoiled round 2's aggregate" in named[0] and "silos 0, 1 decrypted" in named[0]
    assert result.train_metrics_clientapp[4][f"named/{FORGER}"] == 2
    assert not any(
        k.startswith("named/")
        for r in (1, 2, 3, 5)
        for k in result.train_metrics_clientapp.get(r, {})
    )
    assert [(e["round"], e["silo"]) for e in events if e["event"] == "named"] == [(4, FORGER)]
    # its lies as a checker framed nobody, and no later aggregate includes it
    left_out = {e["round"] for e in events if e["event"] == "rejected" and e["silo"] == FORGER}
    assert left_out == {4, 5}
    assert final.contributors == 2
    assert np.isfinite(values).all() and np.linalg.norm(values) < 10 * start_norm
    assert not any(e.startswith("round 5: most silos refused") for e in errors)


def test_an_honest_federation_is_never_named(key_files, silo_keys, tmp_path, fl_log) -> None:  # type: ignore[no-untyped-def]
    # Execute
    result, events, keys, start_norm = _run(key_files, silo_keys, tmp_path, "honest")
    final = update_from_record(result.arrays)
    values = decrypt_update(keys, final)

    # Assert: no refusal, no check, no name; every silo in the last aggregate
    assert not _lines(fl_log, logging.ERROR)
    assert not [e for e in events if e["event"] in ("named", "rejected")]
    assert final.contributors == 3
    assert np.isfinite(values).all() and np.linalg.norm(values) < 10 * start_norm


def test_honest_silos_checked_after_a_refusal_are_never_named(
    key_files, silo_keys, tmp_path, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: silos so strict that they refuse every honest aggregate, so every round
    # after the first rolls back and the next one checks its contributions
    fl_log.set_level(logging.INFO, logger="fl_lbbsp")

    # Execute
    result, events, _, _ = _run(
        key_files, silo_keys, tmp_path, "honest", rounds=4, max_model_ratio=1.0000001
    )

    # Assert: checks were made, nobody is named
    lines = _lines(fl_log, logging.INFO)
    assert any("check the 3 contributions to round" in line for line in lines)
    assert not any("is named" in line or "not named" in line for line in lines)
    assert not [e for e in events if e["event"] == "named"]
    assert not any(
        k.startswith("named/") for m in result.train_metrics_clientapp.values() for k in m
    )


# ---------------------------------------------------------------- the rule, alone
def _report(norms: dict[str, float | None], reference: float = 10.0) -> CheckReport:
    return CheckReport(bad_round=2, reference=reference, norms=norms)


@pytest.mark.parametrize(
    ("reports", "named", "disputed", "undecided"),
    [
        # a and b honest, c forged: a and b check c
        (
            {"a": {"b": 10.2, "c": 1e8}, "b": {"a": 9.9, "c": 1e8}, "c": {"a": 9.9, "b": 10.2}},
            {"c"},
            set(),
            set(),
        ),
        # c unreadable to both checkers
        (
            {"a": {"b": 10.2, "c": None}, "b": {"a": 9.9, "c": None}, "c": {"a": 9.9, "b": 10.2}},
            {"c"},
            set(),
            set(),
        ),
        # c, checking a and b, frames them both: one vote each, not named
        (
            {"a": {"b": 10.2, "c": 1e8}, "b": {"a": 9.9, "c": 1e8}, "c": {"a": 1e9, "b": 1e9}},
            {"c"},
            {"a", "b"},
            set(),
        ),
        # c reports tiny norms for a and b: nothing moves
        (
            {"a": {"b": 10.2, "c": 1e8}, "b": {"a": 9.9, "c": 1e8}, "c": {"a": 1e-9, "b": 1e-9}},
            {"c"},
            {"a", "b"},
            set(),
        ),
        # only b answered about c: one vote cannot name
        ({"b": {"a": 9.9, "c": 1e8}, "c": {"a": 9.9, "b": 10.2}}, set(), set(), {"b", "c"}),
        # honest federation
        (
            {"a": {"b": 10.2, "c": 11.0}, "b": {"a": 9.9, "c": 11.0}, "c": {"a": 9.9, "b": 10.2}},
            set(),
            set(),
            set(),
        ),
    ],
    ids=["forged", "unreadable", "framing", "deflating", "one-checker", "honest"],
)
def test_a_majority_of_two_or_more_checkers_is_needed_to_name(
    reports: dict[str, dict[str, float | None]],
    named: set[str],
    disputed: set[str],
    undecided: set[str],
) -> None:
    # Prepare: every silo checks the two others
    asked = {"a": ["b", "c"], "b": ["a", "c"], "c": ["a", "b"]}

    # Execute
    verdict = judge_checks(
        asked, {s: _report(n) for s, n in reports.items()}, bad_round=2, max_ratio=10.0
    )

    # Assert
    assert set(verdict.named) == named
    assert set(verdict.disputed) == disputed
    assert set(verdict.undecided) == undecided


def test_answers_about_another_round_are_ignored() -> None:
    # Prepare
    asked = {"a": ["c"], "b": ["c"]}
    stale = CheckReport(bad_round=1, reference=10.0, norms={"c": 1e8})

    # Execute
    verdict = judge_checks(asked, {"a": stale, "b": stale}, bad_round=2, max_ratio=10.0)

    # Assert
    assert not verdict.named and set(verdict.undecided) == {"c"}


@pytest.mark.parametrize("silos", [3, 4, 7])
def test_each_contribution_goes_to_two_checkers_never_its_sender(silos: int) -> None:
    # Prepare
    ids = [str(k) for k in range(silos)]

    # Execute
    assignment = assign_checkers(ids, ids)

    # Assert
    checkers = {o: [c for c, owned in assignment.items() if o in owned] for o in ids}
    assert all(len(c) == 2 and o not in c for o, c in checkers.items())
    loads = [len(owned) for owned in assignment.values()]
    assert max(loads) - min(loads) <= 1


# ---------------------------------------------------------------------- the records
def _update(keys, value: float):  # type: ignore[no-untyped-def]
    flat, layout = flatten({"w": np.full(3000, value, dtype=np.float32)})
    return encrypt_update(keys, flat, layout=layout)


def test_requests_and_reports_travel_in_records_and_the_report_is_signed(he_keys) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    requests = [
        CheckRequest(silo=s, bad_round=3, update=_update(he_keys, v))
        for s, v in (("a", 1.0), ("b", 2.0))
    ]
    content = RecordDict(
        {"arrays": ArrayRecord(), "config": ConfigRecord(), **request_records(requests)}
    )
    own = update_to_record(_update(he_keys, 3.5))
    report = CheckReport(bad_round=3, reference=7.5, norms={"a": 54.7, "b": None})

    # Execute
    received = check_requests_of(content)
    answered = with_check_report(own, report)

    # Assert: the requests come back whole; the update still parses, the report with it,
    # and the signature covers the report
    assert [(r.silo, r.bad_round, r.update) for r in received] == [
        (q.silo, q.bad_round, q.update) for q in requests
    ]
    assert update_from_record(answered) == update_from_record(own)
    assert check_report_of(answered) == report and check_report_of(own) is None
    assert ("he-check", report.to_bytes()) in [(n, bytes(d)) for n, d in signed_arrays(answered)]


@pytest.mark.parametrize(
    "data",
    [b"not json", b"[]", b'{"format": "x", "round": 2, "reference": 1.0, "norms": {}}',
     b'{"format": "fl_lbbsp.ckks-check/1", "round": 2, "reference": NaN, "norms": {}}',
     b'{"format": "fl_lbbsp.ckks-check/1", "round": 2, "reference": 1.0, "norms": {"a": "big"}}',
     b" " * 70000],
    ids=["not-json", "list", "format", "nan", "string-norm", "oversized"],
)  # fmt: skip
def test_a_malformed_report_is_refused(data: bytes) -> None:
    # Execute / Assert
    with pytest.raises(InvalidUpdateError, match="check note|check report"):
        CheckReport.from_bytes(data)


def test_a_silo_answers_checks_only_the_round_after_it_refused_a_model(
    key_files, silo_keys, he_keys, fl_log
) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a silo that has refused nothing is asked to check a contribution
    setup = SiloSetup(num_silos=3, model="mlp", secret_context=str(key_files.secret))
    grid = InProcessGrid(make_client_app(setup), num_nodes=3)
    data = silo_data(setup, 0)
    model = build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes)
    flat, layout = flatten({k: v.numpy() for k, v in model.state_dict().items()})
    update = encrypt_update(he_keys, flat, layout=layout)
    strategy = EncryptedLBBSPFedAvg(public_context=key_files.public, **SETTINGS)
    messages = list(strategy.configure_train(1, update_to_record(update), ConfigRecord(), grid))
    asked = CheckRequest(silo="1", bad_round=1, update=update)
    for name, record in request_records([asked]).items():
        messages[0].content[name] = record

    # Execute
    replies = list(grid.send_and_receive(messages))

    # Assert: it trains and replies, without a report, and says why
    assert not replies[0].has_error()
    assert check_report_of(replies[0].content["arrays"]) is None
    warnings = _lines(fl_log, logging.WARNING)
    assert any("check requests ignored: this silo refused no global model" in w for w in warnings)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_exclude_named_for_must_be_a_whole_number_of_rounds(key_files, value: object) -> None:
    # Execute / Assert
    with pytest.raises(InvalidSettingError, match="exclude_named_for"):
        EncryptedLBBSPFedAvg(public_context=key_files.public, exclude_named_for=value, **SETTINGS)


def test_a_named_silo_comes_back_after_exclude_named_for_rounds() -> None:
    # Prepare
    from fl_lbbsp.strategies.encrypted_blame import NamedSilo

    named = NamedSilo(silo="c", named_in=4, bad_round=2, until=5, reason="")

    # Execute / Assert
    assert [named.left_out(r) for r in (3, 4, 5, 6)] == [False, True, True, False]
    assert NamedSilo(silo="c", named_in=4, bad_round=2, until=None, reason="").left_out(10**6)
