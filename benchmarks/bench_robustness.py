"""Section ``robustness``: hostile registered silos against the robust aggregation.

``python benchmarks/bench_robustness.py``. Real federations in process: the LB-BSP
strategy (:class:`~fl_lbbsp.strategies.LBBSPFedAvg`, the project's defaults but for the
aggregation compared) and the bundled silo app on the embedded digits (a small MLP), the
silos' speeds emulated by a cost model (5:1 for 5 silos, the slow ones last, so that
the hostile silos are the ones the balancer sends the smallest batches: the longest
honest updates, the widest bounds). Each hostile silo trains honestly, then replaces its
update (and, for the size-claim liar, its ``num-examples``) before replying:

* ``signflip-K``: ``-K d`` (``d`` its honest update), K = 1, 3, 8;
* ``alie``: ``mu - z sigma`` coordinate-wise over the honest updates of the round ("a
  little is enough", Baruch et al., NeurIPS 2019, ``z`` from their Eq. for n and f);
* ``ipm``: ``-eps mu`` with eps = 2 (inner-product manipulation, Xie et al., UAI 2020);
* ``scaled``: ``30 d`` (a boosted update, as in model replacement, Bagdasaryan et al.,
  AISTATS 2020);
* ``target``: a push of 8 |d| on the output layer's bias toward class 0 ("always 0");
* ``alternating``: ``signflip-8`` in even rounds, honest in odd ones;
* ``+claim``: any of them with a claim of 9.9e6 examples;
* ``excluded``: no attack, the hostile silos' replies refused every round (an error
  reply): the best any defence could do, since none can recover what their data would
  have added. Each cell is also read against it.

Aggregations compared: FedAvg's mean, ``centered-clip`` and ``trusted-clip`` (the default;
:class:`~fl_lbbsp.core.trusted_clip.TrustedClip`: the same clip over the
silos whose history of agreement with the others' centre is not a negative outlier of the
federation's, by the Hampel identifier, while the federation's median is positive). A
held-out check (:data:`HELD_OUT`: partitions and a seed that
were not looked at while the trusted clip's rule was chosen) has its own table.

The attackers are omniscient where the attack needs it (ALIE and IPM read the honest
updates of the round: the silos run one after the other, the hostile ones last). Per
cell: the final accuracy (mean of the last 3 rounds' test accuracy) against the honest
run's with the same aggregation, and what the robust option costs the honest run.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from accuracy_study import plateau, window_mean
from common import mean_ci, parser, quiet_logs
from flwr.app import Array, ArrayRecord, Context, Error, Message
from flwr.clientapp import ClientApp
from report import write_section

from fl_lbbsp.clients.app import SiloApp, decrypt_arrays, encrypt_arrays
from fl_lbbsp.contract import DISTRUSTED, MODEL_REFUSED, RecordKeys
from fl_lbbsp.core.trusted_clip import TrustedClip
from fl_lbbsp.crypto import generate_keys, load_silo_keys, write_key_files
from fl_lbbsp.crypto.records import (
    check_report_of,
    is_encrypted,
    update_from_record,
    with_check_report,
)
from fl_lbbsp.runs.engine import execute
from fl_lbbsp.runs.fl import SimulationConfig, resolve
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg

SECTION = "robustness"
ATTACKS = (
    "honest", "signflip-1", "signflip-3", "signflip-8", "alie", "ipm", "scaled", "target",
    "alternating",
)  # fmt: skip
EXCLUDED = "excluded"
"""The defence oracle's cell: the hostile silos' replies refused every round."""
AGGREGATIONS = ("mean", "centered-clip", "trusted-clip")
CKKS = "ckks"
"""The CKKS cells' aggregation: the server's capped-weight sum of ciphertexts."""
ROBUST = ("centered-clip", "trusted-clip")
"""The robust aggregations the grid compares (beside FedAvg's mean)."""
CLAIM = 9_900_000
"""The size-claim liar's ``num-examples``."""
KEYS = RecordKeys()
FEDERATION: dict[str, Any] = {
    "rounds": 15, "local_steps": 10, "batch_size": 32, "lr": 0.1, "model": "mlp"
}  # fmt: skip
LAST = 3
"""Rounds the final accuracy is averaged over."""


def _speeds(silos: int) -> tuple[float, ...]:
    """5:1 over the silos, fastest first (the hostile silos, the last ones, are slow)."""
    return tuple(5.0 - 4.0 * k / max(silos - 1, 1) for k in range(silos))


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s ``z_max``: ``Phi^-1((n - s) / n)``, ``s = floor(n / 2 + 1) - f``."""
    s = math.floor(n / 2 + 1) - f
    return statistics.NormalDist().inv_cdf((n - s) / n)


class Attackers:
    """The bundled silo app, whose hostile partitions replace their update.

    Parameters
    ----------
    app : SiloApp
        The honest silo.
    attack : str
        One of :data:`ATTACKS`.
    hostile : set of int
        The hostile partition ids.
    silos : int
        Silos of the federation.
    claim : int | None
        The hostile silos' ``num-examples`` claim (``None``: their true size).
    """

    def __init__(
        self, *, app: SiloApp, attack: str, hostile: set[int], silos: int, claim: int | None,
        secret: str | None = None,
    ) -> None:  # fmt: skip
        self.app, self.attack, self.hostile, self.claim = app, attack, hostile, claim
        self.secret = secret
        """The federation's secret CKKS context (CKKS cells: a silo holds it)."""
        self.z = alie_z(silos, len(hostile))
        self.honest: dict[int, list[np.ndarray]] = {}
        """Round -> the honest silos' flattened updates so far."""
        self.totals: dict[int, int] = {}
        """CKKS: round -> ``W`` of the model sent in it (the weights the server applied)."""
        self.refusing: dict[int, int] = {}
        """Round -> silos that refused the global model they were sent (their note)."""
        self.ids: set[str] = set()
        """The hostile silos' ids."""
        self.bounded = 0
        """CKKS: hostile updates cut to the keys' value bound (the most a ciphertext that
        passes the silo's own encryption checks can carry)."""

    def _plain(self, record: ArrayRecord) -> dict[str, np.ndarray]:
        if self.secret is None or not is_encrypted(record):
            return {k: np.asarray(a.numpy()) for k, a in record.items()}
        return decrypt_arrays(record, self.secret)[0]

    def _seal(self, arrays: dict[str, np.ndarray], old: ArrayRecord) -> ArrayRecord:
        if self.secret is None:
            return ArrayRecord({k: Array(a) for k, a in arrays.items()})
        try:
            record = encrypt_arrays(arrays, self.secret)[0]
        except ValueError:  # above 2^value_bits: send the most the keys carry
            self.bounded += 1
            bound = load_silo_keys(self.secret).config.max_abs_value
            record = encrypt_arrays(
                {k: np.clip(a, -bound, bound) for k, a in arrays.items()}, self.secret
            )[0]
        report = check_report_of(old)  # its (honest) answers to the server's checks
        return record if report is None else with_check_report(record, report)

    def train(self, msg: Message, context: Context) -> Message:
        """Train honestly; a hostile silo then replaces its update."""
        reply = self.app.train(msg, context)
        if not reply.has_content():
            return reply
        p = int(context.node_config["partition-id"])  # type: ignore[arg-type]
        rnd = int(msg.content.config_records["config"][KEYS.server_round])  # type: ignore[arg-type]
        record = msg.content.array_records["arrays"]
        if self.secret is not None and is_encrypted(record):
            self.totals[rnd] = update_from_record(record).weight
        note = reply.content.config_records.get(KEYS.silo_record)
        if note is not None and MODEL_REFUSED in note:
            self.refusing[rnd] = self.refusing.get(rnd, 0) + 1
        sent, old = self._plain(record), reply.content.array_records["arrays"]
        got = self._plain(old)
        names = list(sent.keys())
        start = [np.asarray(sent[k], dtype=np.float64) for k in names]
        delta = np.concatenate(
            [
                (np.asarray(got[k], dtype=np.float64) - s).ravel()
                for k, s in zip(names, start, strict=True)
            ]
        )
        if p not in self.hostile:
            self.honest.setdefault(rnd, []).append(delta)
            return reply
        self.ids.add(self.app.node(context).silo_id)
        if self.attack == EXCLUDED:
            return Message(Error(code=0, reason="excluded (the defence oracle)"), reply_to=msg)
        bad = self._poison(delta, rnd, start)
        arrays: dict[str, np.ndarray] = {}
        offset = 0
        for k, s in zip(names, start, strict=True):
            part = bad[offset : offset + s.size].reshape(s.shape)
            offset += s.size
            arrays[k] = (s + part).astype(np.asarray(got[k]).dtype)
        reply.content["arrays"] = self._seal(arrays, old)
        if self.claim is not None:
            for record in reply.content.metric_records.values():
                if KEYS.num_examples in record:
                    record[KEYS.num_examples] = self.claim
        return reply

    def _poison(self, d: np.ndarray, rnd: int, start: list[np.ndarray]) -> np.ndarray:
        attack = self.attack
        if attack == "alternating":
            attack = "signflip-8" if rnd % 2 == 0 else "honest"
        if attack == "honest":
            return d
        if attack.startswith("signflip-"):
            return -float(attack.removeprefix("signflip-")) * d
        if attack == "scaled":
            return 30.0 * d
        honest = self.honest.get(rnd) or [d]
        mu = np.mean(honest, axis=0)
        if attack == "alie":
            sigma = np.std(honest, axis=0)
            return mu - self.z * sigma
        if attack == "ipm":
            return -2.0 * mu
        if attack == "target":  # the output bias: +c on class 0, -c/9 on the others
            push = np.zeros_like(d)
            offset = sum(s.size for s in start[:-1])
            bias = start[-1]
            if bias.ndim == 1 and bias.size > 1:
                push[offset : offset + bias.size] = -1.0 / (bias.size - 1)
                push[offset] = 1.0
            return 8.0 * float(np.linalg.norm(d)) * push / max(float(np.linalg.norm(push)), 1e-12)
        raise ValueError(f"unknown attack {attack!r}")


def run_cell(
    *,
    partition: str,
    silos: int,
    hostile: int,
    attack: str,
    claim: bool,
    aggregation: str,
    seed: int,
    federation: dict[str, Any],
    clip_factor: float | None = None,
    max_weight_ratio: float | None = None,
    bound_claimed_pull: bool = False,
) -> dict[str, Any]:
    """One federation; its accuracy per round, the rounds rolled back and rejections.

    ``aggregation`` :data:`CKKS`: the federation encrypted (fresh keys of the defaults,
    :class:`~fl_lbbsp.strategies.encrypted.EncryptedLBBSPFedAvg`, federated evaluation on
    the silos' test shards); the hostile silos decrypt, poison and re-encrypt."""
    with tempfile.TemporaryDirectory() as scratch:
        ckks = aggregation == CKKS
        keys = write_key_files(generate_keys(), Path(scratch) / "keys") if ckks else None
        config = SimulationConfig(
            seed=seed,
            silos=silos,
            speeds=_speeds(silos),
            partition=partition,
            rounds=federation["rounds"],
            local_steps=federation["local_steps"],
            batch_size=federation["batch_size"],
            lr=federation["lr"],
            dataset="embedded",
            model=federation["model"],
            runtime="inprocess",
            emulate_wait=False,
            cost_model="0.0001,0.001",
            out=Path(scratch),
            encrypt=None if keys is None else keys.secret.parent,
        )
        settings = {
            **config.strategy_settings(),
            "local_steps": config.local_steps,
            "balance": True,
            "check_times": False,
            **({} if clip_factor is None else {"clip_factor": clip_factor}),
            **({} if max_weight_ratio is None else {"max_weight_ratio": max_weight_ratio}),
            **({"bound_claimed_pull": True} if bound_claimed_pull else {}),
        }
        strategy: LBBSPFedAvg = (
            EncryptedLBBSPFedAvg(
                public_context=keys.public,
                fraction_evaluate=1.0,
                min_evaluate_nodes=silos,
                **settings,
            )  # fmt: skip
            if keys is not None
            else LBBSPFedAvg(
                fraction_evaluate=0.0,
                robust_aggregation=aggregation,  # type: ignore[arg-type]
                **settings,
            )
        )
        resolved = resolve(config, strategy=strategy)
        app = ClientApp()
        attackers = Attackers(
            app=SiloApp(config.silo_setup()),
            attack=attack,
            hostile=set(range(silos - hostile, silos)),
            silos=silos,
            claim=CLAIM if claim else None,
            secret=None if keys is None else str(keys.secret),
        )
        app.train()(attackers.train)
        app.evaluate()(attackers.app.evaluate)  # CKKS: the silos evaluate
        error = None
        try:
            events = execute(replace(resolved, client_app=app), runtime="inprocess")
        except Exception as err:  # noqa: BLE001 - a run the attack stops is a result
            error = f"{type(err).__name__}: {str(err)[:200]}"
            events = []
            path = Path(scratch) / "telemetry.jsonl"
            for found in Path(scratch).rglob("*.jsonl"):
                path = found
            if path.is_file():
                events = [json.loads(line) for line in path.read_text().splitlines() if line]
    accuracy = [float(e["accuracy"]) for e in events if e.get("event") == "evaluate"]
    rejected = sum(len(e.get("rejected") or []) for e in events if e.get("event") == "train")
    distrusted = sum(len(e.get(DISTRUSTED) or []) for e in events if e.get("event") == "train")
    robust = getattr(strategy.updates, "robust", None)
    tail = accuracy[-LAST:]
    shares, mismatched = _liar_shares(events, attackers) if claim else ([], 0)
    final = statistics.fmean(tail) if tail and all(map(math.isfinite, tail)) else None
    return {
        "accuracy": accuracy,
        "final": final,
        "rejected": rejected,
        "rollbacks": strategy.defenses.rollbacks,
        "clipped": getattr(robust, "clipped_total", 0),
        "distrusted": distrusted,
        "agreement": (
            {s: round(a.score, 3) for s, a in robust.history.items()}
            if isinstance(robust, TrustedClip)
            else None
        ),
        "error": error,
        "refusing": sum(attackers.refusing.values()),
        "refused-rounds": sum(2 * n > silos for n in attackers.refusing.values()),
        "named": sorted({str(e["silo"]) for e in events if e.get("event") == "named"}),
        "liar-share": max(shares, default=None),
        "applied-not-logged": mismatched,
        "bounded": attackers.bounded,
    }


def _liar_shares(events: Sequence[dict[str, Any]], attackers: Attackers) -> tuple[list[float], int]:
    """Per round the hostile silos aggregated in, their share of the weight: the weights
    logged (``capped-weight``, else ``num-examples``) over their sum in plaintext, over the
    ``W`` of the next round's CKKS aggregate (the weights the server applied) in CKKS; and
    the CKKS rounds whose ``W`` differs from the logged weights' sum (a rollback sends an
    earlier aggregate)."""
    shares, mismatched = [], 0
    for e in events:
        if e.get("event") != "train" or not e.get("silos"):
            continue
        out = {str(r["silo"]) for r in e.get("rejected") or []}
        logged = {
            s: float(r.get("capped-weight", r[KEYS.num_examples]))
            for s, r in e["silos"].items() if s not in out and KEYS.num_examples in r
        }  # fmt: skip
        liar = sum(w for s, w in logged.items() if s in attackers.ids)
        if not liar:
            continue
        total = attackers.totals.get(int(e["round"]) + 1) if attackers.secret else None
        if total is not None and total != round(math.fsum(logged.values())):
            mismatched += 1
            continue
        shares.append(liar / (total or math.fsum(logged.values())))
    return shares, mismatched


def jobs(smoke: bool, robust: Sequence[str] = ROBUST, seeds: int = 8) -> list[dict[str, Any]]:
    """The runs in the order they matter (a time limit keeps a prefix): the honest runs
    of 5 silos; the defence oracle of 5 silos; 1 hostile of 5 against each robust
    aggregation in ``robust`` (labels:2, dirichlet:0.3, iid); the honest runs' other
    seeds (the robust options' cost); the held-out check (:data:`HELD_OUT`); 2 of 5;
    1 of 5 against FedAvg's mean; the size-claim liars; 2 of 10; the CKKS cells
    (:data:`CKKS_PARTITIONS`, :data:`CKKS_ATTACKS`). Every robust aggregation is run in
    the same cells, one after the other."""
    if smoke:
        return [
            {"partition": "iid", "silos": 5, "hostile": h, "attack": a, "claim": False,
             "aggregation": g, "seed": 0}
            for h, a in ((0, "honest"), (1, "signflip-8")) for g in ("mean", *robust, CKKS)
        ]  # fmt: skip
    out: list[dict[str, Any]] = []

    def add(partition: str, silos: int, hostile: int, attack: str, claim: bool,
            aggs: Sequence[str], seed: int = 0, rounds: int | None = None) -> None:  # fmt: skip
        for agg in aggs:
            out.append({"partition": partition, "silos": silos, "hostile": hostile,
                        "attack": attack, "claim": claim, "aggregation": agg,
                        "seed": seed,
                        **({} if rounds is None else {"rounds": rounds})})  # fmt: skip

    every = ("mean", *robust)
    for partition in PARTITIONS:
        add(partition, 5, 0, "honest", False, every)
    for partition, silos, hostile in EXCLUDED_CELLS:
        if silos == 5:
            add(partition, silos, hostile, EXCLUDED, False, ("centered-clip",))
    for partition in ("labels:2", "dirichlet:0.3", "iid"):
        for attack in ATTACKS[1:]:
            add(partition, 5, 1, attack, False, robust)
    for seed in range(1, seeds):
        for partition in ("labels:2", "dirichlet:0.3"):
            add(partition, 5, 0, "honest", False, every, seed)
    for partition, seed in HELD_OUT:
        add(partition, 5, 0, "honest", False, robust, seed)
        add(partition, 5, 1, EXCLUDED, False, ("centered-clip",), seed)
        for attack in HELD_OUT_ATTACKS:
            add(partition, 5, 1, attack, False, robust, seed)
    for partition in ("labels:2", "dirichlet:0.3", "iid"):
        for attack in ATTACKS[1:]:
            add(partition, 5, 2, attack, False, robust)
    for partition in ("iid", "labels:2"):
        for attack in ATTACKS[1:]:
            add(partition, 5, 1, attack, False, ("mean",))
    for attack in ATTACKS[1:]:
        add("iid", 5, 1, attack, True, robust)
    for partition, silos, hostile in EXCLUDED_CELLS:
        if silos == 10:
            add(partition, silos, hostile, EXCLUDED, False, ("centered-clip",))
    for partition in PARTITIONS:
        add(partition, 10, 0, "honest", False, every)
        for attack in ATTACKS[1:]:
            add(partition, 10, 2, attack, False, robust)
    for attack in ATTACKS[1:]:
        add("iid", 5, 2, attack, True, robust)
    for partitions in (CKKS_PARTITIONS[:2], CKKS_PARTITIONS[2:]):
        for partition in partitions:
            add(partition, 5, 0, "honest", False, (CKKS,))
        for partition in partitions:
            for attack in CKKS_ATTACKS:
                add(partition, 5, 1, attack, False, (CKKS,))
            add(partition, 5, 1, "signflip-1", True, ("mean", CKKS))
    for seed in range(seeds):
        for partition in ("labels:2", "dirichlet:0.3"):
            add(partition, 5, 0, "honest", False, every, seed, PLATEAU_ROUNDS)
    for partition, seed in PLATEAU_HELD_OUT:
        add(partition, 5, 0, "honest", False, every, seed, PLATEAU_ROUNDS)
    return out


PLATEAU_ROUNDS = 50
"""Rounds of the honest runs that measure a robust aggregation's cost at FedAvg's
plateau (``accuracy_study.plateau`` of the mean's run: W = 5 rounds gaining under 0.5
points), the accuracy study's horizon: 15 rounds of labels:2 are far from it."""
PLATEAU_HELD_OUT = tuple(
    (p, seed) for seed in range(200, 204) for p in ("labels:3", "dirichlet:1.0")
)
"""The plateau cost's held-out cells (never run before the figure was defined)."""


CKKS_PARTITIONS = ("iid", "labels:2", "dirichlet:0.3")
"""The CKKS cells' partitions (the last after the others' cells)."""
CKKS_ATTACKS = (
    "signflip-1", "signflip-8", "scaled", "ipm", "alie", "target", "alternating"
)  # fmt: skip
"""The CKKS cells' attacks, 1 hostile of 5 (and ``signflip-1 +claim``, beside its
plaintext twin under FedAvg's mean: the liar's weight share in both)."""


HELD_OUT = tuple((p, seed) for seed in range(100, 104) for p in ("dirichlet:1.0", "labels:3"))
"""The held-out check: partitions and a seed never looked at while the trusted clip was
designed (its rule was chosen on the principle and on labels:2, dirichlet:0.3 and iid at
seed 0); read on its own, apart from the goal figures."""
HELD_OUT_ATTACKS = ("signflip-1", "ipm")
"""The attacks of the held-out check: those that beat centered clipping on non-IID
silos."""


PARTITIONS = ("iid", "labels:2", "dirichlet:0.3")
EXCLUDED_CELLS = [
    (partition, silos, hostile)
    for partition in PARTITIONS for silos, hostile in ((5, 1), (5, 2), (10, 2))
]  # fmt: skip
"""The (partition, silos, hostile) groups whose defence oracle is run."""
SEEDS = 8
"""Seeds of the honest non-IID runs (the robust options' cost; ``--seeds``)."""


def section(rows: Sequence[dict[str, Any]], *, complete: bool, seconds: float,
            load: str) -> dict[str, Any]:  # fmt: skip
    """The section from the runs: a row per attack cell against its honest run."""
    every_run, long_runs = list(rows), [r for r in rows if "rounds" in r]
    rows = [r for r in rows if "rounds" not in r]
    honest = {
        (r["partition"], r["silos"], r["aggregation"], r["seed"]): r["final"]
        for r in rows if r["attack"] == "honest"
    }  # fmt: skip
    oracle = {
        (r["partition"], r["silos"], r["hostile"], r["seed"]): r["final"]
        for r in rows if r["attack"] == EXCLUDED
    }  # fmt: skip
    robust = [a for a in AGGREGATIONS[1:] if any(r["aggregation"] == a for r in rows)]
    held = {p for p, _ in HELD_OUT}
    drops: dict[tuple[str, str], list[float]] = {
        (a, k): [] for a in robust for k in ("1/5", "2/5", "2/10")
    }
    below: dict[tuple[str, str], list[float]] = {key: [] for key in drops}
    table, checks = [], []
    held_drops: dict[str, list[float]] = {}
    nan_runs = 0
    for r in rows:
        if r["attack"] in ("honest", EXCLUDED) or r["aggregation"] == CKKS:
            continue
        base = honest.get((r["partition"], r["silos"], r["aggregation"], r["seed"]))
        diff = None if r["final"] is None or base is None else 100 * (r["final"] - base)
        best = oracle.get((r["partition"], r["silos"], r["hostile"], r["seed"]))
        gap = None if r["final"] is None or best is None else 100 * (r["final"] - best)
        if r["final"] is None:
            nan_runs += 1
        key = f"{r['hostile']}/{r['silos']}"
        cell = (r["aggregation"], key)
        if r["partition"] in held and r["final"] is not None and base is not None:
            held_drops.setdefault(r["aggregation"], []).append(-(diff or 0.0))
        if r["partition"] not in held and not r["claim"] and cell in drops:
            drops[cell].append(math.inf if r["final"] is None or base is None else -(diff or 0.0))
            if best is not None:
                below[cell].append(math.inf if gap is None else -gap)
        (checks if r["partition"] in held else table).append([
            r["partition"], key, r["attack"] + (" +claim" if r["claim"] else ""),
            r["aggregation"], _pct(r["final"]), _pct(base),
            "-" if diff is None else f"{diff:+.1f}", _pct(best),
            "-" if gap is None else f"{gap:+.1f}", str(r["rejected"]), str(r["rollbacks"]),
            str(r["clipped"]), str(r.get("distrusted", 0)),
        ])  # fmt: skip
    costs = []
    for agg in robust:
        for partition in ("labels:2", "dirichlet:0.3"):
            pairs = [
                100 * (honest[(partition, 5, agg, s)] - honest[(partition, 5, "mean", s)])
                for s in range(SEEDS)
                if honest.get((partition, 5, agg, s)) is not None
                and honest.get((partition, 5, "mean", s)) is not None
            ]
            if pairs:
                mean, _, high = mean_ci(pairs)
                half = high - mean
                costs.append((agg, partition, len(pairs), mean, half))
    # a share's cells in the full grid: a prefix with fewer is not judged
    cells = 0 if complete else (len(ATTACKS) - 1) * len(PARTITIONS)
    figures = [
        {"label": f"largest drop under attack, {k} hostile, {a}", "unit": " points",
         "value": max(v) if v and len(v) >= cells and math.isfinite(max(v)) else None,
         "format": ".1f", "goal": {"op": "<=", "target": 2.0 if k == "1/5" else 5.0},
         "note": f"{len(v)} cells" + (" (none run)" if not v else "" if len(v) >= cells else
                                      f" of {cells} run: not judged"
                                      + (f" (largest {max(v):.1f})" if v else ""))}
        for (a, k), v in drops.items()
    ]  # fmt: skip
    for (a, k), v in below.items():
        if v:
            figures.append({
                "label": f"largest drop below the hostile silos excluded, {k}, {a}",
                "unit": " points", "value": max(v) if math.isfinite(max(v)) else None,
                "format": ".1f", "goal": None,
                "note": f"{len(v)} cells; the best any defence could do (their data lost)",
            })  # fmt: skip
    for agg, partition, n, mean, half in costs:
        figures.append({
            "label": f"{agg} minus mean, honest {partition}, 5 silos, after "
                     f"{FEDERATION['rounds']} rounds (lower 95% bound)",
            "unit": " points", "value": mean - half if math.isfinite(half) else None,
            "format": ".2f", "goal": None,
            "note": f"mean {mean:+.2f}, 95% half-width {half:.2f}, {n} seeds; not at "
                    "plateau (the goal is judged there, below)",
        })  # fmt: skip
    figures += _plateau_costs(long_runs, robust)
    for agg, v in held_drops.items():
        figures.append({
            "label": f"largest drop under attack, held-out check, 1/5 hostile, {agg}",
            "unit": " points", "value": max(v), "format": ".1f", "goal": None,
            "note": f"{len(v)} cells (" + ", ".join(sorted(held)) + ")",
        })  # fmt: skip
    columns = [
        "partition", "hostile", "attack", "aggregation", "final", "honest", "diff",
        "excluded", "vs excluded", "rejected", "rollbacks", "clipped", "distrusted",
    ]  # fmt: skip
    tables = [
        {
            "title": "Final accuracy per cell against the honest run of the same aggregation",
            "columns": columns,
            "rows": table,
        }
    ]
    encrypted, ckks_figures = _ckks(rows, honest)
    figures += ckks_figures
    if encrypted:
        tables.append({
            "title": "CKKS: 1 hostile silo of 5; the server cannot read updates, the silos "
                     "check each aggregate they decrypt",
            "columns": [
                "partition", "attack", "final", "honest", "diff", "refused rounds",
                "refusals", "rollbacks", "rejected", "named", "cut to bound",
                "liar share", "plaintext liar share",
            ],
            "rows": encrypted,
        })  # fmt: skip
    if checks:
        tables.append({
            "title": (
                "Held-out check (partitions "
                + " and ".join(sorted({p for p, _ in HELD_OUT}))
                + ", seeds "
                + ", ".join(str(s) for s in sorted({s for _, s in HELD_OUT}))
                + ": not looked at while the trusted clip was designed)"
            ),
            "columns": columns,
            "rows": checks,
        })  # fmt: skip
    return {
        "section": SECTION,
        "title": "Robustness: hostile registered silos against the robust aggregation",
        "setting": (
            f"{len(every_run)} in-process federations ({'all' if complete else 'a prefix of'} "
            f"the grid, {len(long_runs)} of them honest runs of {PLATEAU_ROUNDS} rounds for "
            f"the cost at plateau; {sum(1 for r in every_run if r.get('cached'))} reused from "
            f"an earlier invocation's cache, the rest run in {seconds / 60:.1f} min, load "
            f"{load}; {sum(float(r.get('seconds') or 0.0) for r in every_run) / 60:.1f} min of "
            "runs in all): "
            "LBBSPFedAvg with its defaults "
            f"(max_weight_ratio 2, clip radius 1 median) on the embedded digits, MLP, "
            f"{FEDERATION['rounds']} rounds,"
            f" tau {FEDERATION['local_steps']}, B_init {FEDERATION['batch_size']}, eta "
            f"{FEDERATION['lr']}; speeds 5:1 emulated by a cost model, the hostile silos the "
            f"slowest (smallest batches). Final accuracy: mean of the last {LAST} rounds. "
            "The robust aggregations compared: "
            + ", ".join(robust)
            + ". CKKS cells: EncryptedLBBSPFedAvg (keys of the defaults: N 4096, primes "
            "60 and 40 bits, scale 2^35; values bounded by 4), the same federations "
            "evaluated by the silos on their test shards; the hostile silo holds the key, "
            "decrypts, poisons and re-encrypts its update."
        ),
        "figures": figures,
        "tables": tables,
        "plots": [],
        "notes": [
            f"{nan_runs} runs ended with no finite final accuracy.",
            "`excluded`: the same federation with the hostile silos' replies refused every "
            "round (centered-clip), the best any defence could do: the honest run's gap to it "
            "is their data's contribution, which no defence recovers.",
            "`clipped`: updates clipped by the robust aggregation over the run (0 for mean). "
            "`distrusted`: silo-rounds the trusted clip left out (their history of "
            "agreement with the others' centre a negative outlier of the federation's, "
            "by the Hampel identifier, while the federation's median is positive). "
            "`rejected`: replies the update screen or the reply checks left out.",
            "Held-out cells (their own table) are not in the goal figures.",
            f"The honest cost is judged at FedAvg's plateau ({PLATEAU_ROUNDS}-round runs, the "
            "mean run's plateau round by `accuracy_study.plateau`: 5 rounds gaining under 0.5 "
            f"points, each scheme's mean accuracy over those 5 rounds); after "
            f"{FEDERATION['rounds']} rounds labels:2 is still climbing.",
        ],
        "runs": [{k: v for k, v in r.items()} for r in every_run],
    }


def _plateau_costs(rows: Sequence[dict[str, Any]], robust: Sequence[str]) -> list[dict[str, Any]]:
    """Each robust aggregation's cost to honest runs at FedAvg's plateau: per seed, the
    mean accuracy of rounds P-4..P of the robust run minus the mean's (P the mean run's
    plateau round), over the seeds (Student's t); the held-out partitions apart."""
    runs = {(r["partition"], r["aggregation"], r["seed"]): r["accuracy"] for r in rows}
    out = []
    for partition in ("labels:2", "dirichlet:0.3", *sorted({p for p, _ in PLATEAU_HELD_OUT})):
        held = partition not in ("labels:2", "dirichlet:0.3")
        for agg in robust:
            diffs, ends = [], []
            for (p, a, seed), accuracy in sorted(runs.items()):
                base = runs.get((p, "mean", seed))
                if p != partition or a != agg or base is None or not base:
                    continue
                end = plateau(base)
                diffs.append(100 * (window_mean(accuracy, end) - window_mean(base, end)))
                ends.append(end)
            if len(diffs) < 2:
                continue
            mean, _, high = mean_ci(diffs)
            half = high - mean
            out.append({
                "label": f"{agg} minus mean at FedAvg's plateau, honest {partition}, 5 silos "
                         "(lower 95% bound)" + (", held-out check" if held else ""),
                "unit": " points", "value": mean - half, "format": ".2f",
                "goal": None if held else {"op": ">=", "target": -0.5},
                "note": f"mean {mean:+.2f}, 95% half-width {half:.2f}, {len(diffs)} seeds; "
                        f"plateau rounds {min(ends)}-{max(ends)} of {PLATEAU_ROUNDS}",
            })  # fmt: skip
    return out


def _ckks(
    rows: Sequence[dict[str, Any]], honest: dict[tuple[Any, ...], float | None]
) -> tuple[list[list[str]], list[dict[str, Any]]]:
    """The CKKS cells' table rows and figures: the largest drop under attack, and per
    partition the size-claim liar's largest weight share over its plaintext twin's."""
    twin = {
        r["partition"]: r.get("liar-share") for r in rows
        if r["claim"] and r["aggregation"] == "mean" and r["attack"] == "signflip-1"
    }  # fmt: skip
    table, drops, figures = [], [], []
    for r in rows:
        if r["aggregation"] != CKKS or r["attack"] == "honest":
            continue
        base = honest.get((r["partition"], r["silos"], CKKS, r["seed"]))
        diff = None if r["final"] is None or base is None else 100 * (r["final"] - base)
        drops.append(math.inf if diff is None else -diff)
        share, plain = r.get("liar-share"), twin.get(r["partition"]) if r["claim"] else None
        table.append([
            r["partition"], r["attack"] + (" +claim" if r["claim"] else ""), _pct(r["final"]),
            _pct(base), "-" if diff is None else f"{diff:+.1f}", str(r["refused-rounds"]),
            str(r["refusing"]), str(r["rollbacks"]), str(r["rejected"]),
            " ".join(r["named"]) or "-", str(r["bounded"]), _pct(share), _pct(plain),
        ])  # fmt: skip
        if share is not None and plain is not None:
            figures.append({
                "label": f"size-claim liar's weight share, CKKS minus plaintext, "
                         f"{r['partition']}",
                "unit": " points", "value": 100 * (share - plain), "format": ".2f",
                "goal": {"op": "<=", "target": 0.01},
                "note": f"largest share over the rounds: CKKS {100 * share:.2f}% (from the "
                        f"aggregate's W), plaintext {100 * plain:.2f}%; "
                        f"{r['applied-not-logged']} rounds whose W differs from the logged "
                        "weights",
            })  # fmt: skip
    if drops:
        figures.append({
            "label": "largest drop under attack, 1/5 hostile, CKKS", "unit": " points",
            "value": max(drops) if math.isfinite(max(drops)) else None, "format": ".1f",
            "goal": None, "note": f"{len(drops)} cells, against the CKKS honest run",
        })  # fmt: skip
    return table, figures


def _key(job: dict[str, Any]) -> str:
    return json.dumps([job[k] for k in ("partition", "silos", "hostile", "attack", "claim",
                                          "aggregation", "seed")]
                      + [job.get("rounds", FEDERATION["rounds"])])  # fmt: skip


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the grid (as much as ``--minutes`` allows) and write the section's JSON."""
    cli = parser(__doc__.splitlines()[0])
    cli.add_argument("--minutes", type=float, default=19.0)
    cli.add_argument(
        "--robust", nargs="+", choices=AGGREGATIONS[1:], default=list(ROBUST),
        help="the robust aggregations compared beside FedAvg's mean",
    )  # fmt: skip
    cli.add_argument(
        "--seeds", type=int, default=SEEDS,
        help="seeds of the honest non-IID runs (the robust options' cost)",
    )  # fmt: skip
    cli.add_argument(
        "--cache", type=Path, default=None,
        help="JSON lines of finished runs: reused, and each new run appended",
    )  # fmt: skip
    cli.add_argument(
        "--reuse", type=Path, default=None,
        help="an earlier robustness.json: its runs are reused as from the cache",
    )  # fmt: skip
    args = cli.parse_args(argv)
    cached: dict[str, dict[str, Any]] = {}
    if args.reuse is not None:
        for row in json.loads(args.reuse.read_text())["runs"]:
            cached[_key(row)] = row
    if args.cache is not None and args.cache.is_file():
        for line in args.cache.read_text().splitlines():
            row = json.loads(line)
            cached[_key(row)] = row
    federation = {**FEDERATION, "rounds": 3} if args.smoke else FEDERATION
    deadline = time.monotonic() + 60.0 * args.minutes
    rows: list[dict[str, Any]] = []
    started = time.monotonic()
    todo = jobs(args.smoke, args.robust, args.seeds)
    with quiet_logs():
        for job in todo:
            if _key(job) in cached:
                rows.append({**cached[_key(job)], "cached": True})
                continue
            if time.monotonic() > deadline:
                continue
            t0 = time.monotonic()
            cell = {k: v for k, v in job.items() if k != "rounds"}
            horizon = {**federation, "rounds": job["rounds"]} if "rounds" in job else federation
            result = run_cell(**cell, federation=horizon)
            rows.append({**job, **result, "seconds": round(time.monotonic() - t0, 1)})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            if args.cache is not None:
                with args.cache.open("a") as cache:
                    cache.write(json.dumps(rows[-1]) + "\n")
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    data = section(rows, complete=len(rows) == len(todo), seconds=time.monotonic() - started,
                   load=load)  # fmt: skip
    write_section(data, Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
