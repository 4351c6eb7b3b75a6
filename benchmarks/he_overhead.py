"""Benchmark: what encrypted aggregation costs: three CKKS settings side by side, and
CKKS against Paillier.

The three CKKS settings, in one run, on a LeNet-5-sized update (61,706 parameters, from
``fl_lbbsp.models``) at 5 and 100 silos and a 1M-parameter update at 5 silos:

* **NVFlare default** (``benchmarks/nvflare_reference.py``: FLARE's TenSEAL calls, N = 8192,
  [60, 40, 40], scale 2^40, one vector per layer, weighted by the client, the server adds and
  multiplies by 1 / sum of the weights);
* **previous** (this project before the change: TenSEAL vectors, N = 8192, [60, 40], scale
  2^40, symmetric, one value per slot, chunks of N/2, each silo pre-weighted by n_i / S, the
  server adds);
* **new** (``fl_lbbsp.crypto``: SEAL through ``tenseal.sealapi``, N = 4096, [60, 40], scale
  2^35, seeded symmetric ciphertexts at the data level, two values per slot, unweighted, the
  server multiplies each by its integer weight n_i and adds).

For each: upload and download bytes per parameter, encryption and decryption time per
silo, the server's aggregation time (its checks included where it makes them) and the
aggregate's max error against the plaintext weighted average, absolute and relative to the
update's range (max - min).
Against Paillier, for LeNet-5 and 1M-parameter updates at 5 and 10 silos, with the new CKKS:

* Paillier, 2048-bit keys, python-paillier with gmpy2: one value per ciphertext as stock FATE
  does (a sample of values timed, extrapolated to the whole update), and packed
  BatchCrypt-style (Zhang et al., USENIX ATC 2020): values quantised to 16 bits, offset to
  be non-negative, with ceil(log2 m) bits of headroom per slot so that the sum of m silos
  cannot overflow into the next slot, as many slots per plaintext as fit (a sample of
  ciphertexts timed, extrapolated). The clipping range is the true max |w_i u_i| over all
  silos, which favours Paillier (BatchCrypt has to estimate it).
* The CKKS round overhead in the demo setting (5 silos, LeNet-5 on the embedded digits,
  tau=40, B_init=48, LB-BSP, emulated capacities 16:8:8:4:4), both federations run in process
  without Ray, one round of each in turn: round time = max_i(train-time_i [+ he-time_i]) +
  server aggregation time.

End to end = encrypt on one silo (silos work in parallel) + aggregate + decrypt on one silo.
All figures are wall-clock on this machine; the timings of the whole script are noisy where
the machine is shared.

Run: ``python benchmarks/he_overhead.py [--json runs/bench/he_overhead.json]``
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import nvflare_reference
import tenseal as ts
import torch
from flwr.app import ArrayRecord, ConfigRecord

from fl_lbbsp.clients.app import SiloSetup, make_client_app, silo_data
from fl_lbbsp.crypto import (
    CKKSKeys,
    UpdateChecker,
    aggregate_updates,
    decrypt_update,
    encrypt_update,
    flatten,
    generate_keys,
    write_key_files,
)
from fl_lbbsp.crypto.ckks import Layout
from fl_lbbsp.models import build_model
from fl_lbbsp.runs.inprocess import InProcessGrid
from fl_lbbsp.strategies import LBBSPFedAvg
from fl_lbbsp.strategies.encrypted import EncryptedLBBSPFedAvg
from fl_lbbsp.telemetry import read_telemetry

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------ updates
def make_updates(kind: str, silos: int, seed: int) -> tuple[list[np.ndarray], list[int], Layout]:
    """``silos`` flat updates of one model size, their dataset sizes n_i and the layout."""
    rng = np.random.default_rng(seed)
    if kind == "lenet5":
        torch.manual_seed(seed)
        model = build_model("lenet5", input_shape=(1, 32, 32), num_classes=10)
        base, layout = flatten({k: v.numpy() for k, v in model.state_dict().items()})
        updates = [base + rng.normal(scale=0.01, size=base.size) for _ in range(silos)]
    else:
        updates = [rng.normal(scale=0.05, size=1_000_000) for _ in range(silos)]
        _, layout = flatten({"w": np.zeros(1_000_000)})
    sizes = [int(n) for n in rng.integers(100, 1000, size=silos)]
    return updates, sizes, layout


def weighted_mean(updates: Sequence[np.ndarray], sizes: Sequence[int]) -> np.ndarray:
    return np.average(np.stack(updates), axis=0, weights=np.asarray(sizes, dtype=np.float64))


def _timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


# ----------------------------------------------------------------------------------- CKKS
def _errors(result: np.ndarray, expected: np.ndarray) -> dict[str, float]:
    error = float(np.abs(result - expected).max())
    return {
        "max_abs_error": error,
        "max_rel_error": error / float(expected.max() - expected.min()),
    }


def _finish(out: dict[str, Any]) -> dict[str, Any]:
    out["end_to_end_s"] = out["encrypt_s"] + out["aggregate_s"] + out["decrypt_s"]
    return out


def bench_new(
    keys: CKKSKeys, updates: Sequence[np.ndarray], sizes: Sequence[int], repeat: int
) -> dict[str, Any]:
    """fl_lbbsp.crypto: encrypt unweighted (per silo); the server checks every update,
    multiplies it by n_i and adds (serialization included); decrypt (check, decrypt,
    divide by sum n_i). Medians of ``repeat``."""
    server = keys.public()
    num = updates[0].size
    encrypt_times, aggregate_times, decrypt_times = [], [], []
    for _ in range(repeat):
        sent = []
        for u in updates:
            update, seconds = _timed(lambda u=u: encrypt_update(keys, u))
            sent.append(update)
            encrypt_times.append(seconds)
        checker = UpdateChecker(server, num_values=num)
        summed, seconds = _timed(
            lambda sent=sent, checker=checker: aggregate_updates(
                server, [checker.check(u) for u in sent], list(sizes)
            )
        )
        aggregate_times.append(seconds)
        result, seconds = _timed(lambda summed=summed: decrypt_update(keys, summed))
        decrypt_times.append(seconds)
    return _finish(
        {
            "encrypt_s": statistics.median(encrypt_times),
            "aggregate_s": statistics.median(aggregate_times),
            "decrypt_s": statistics.median(decrypt_times),
            "bytes_per_param_up": sent[0].nbytes / num,
            "bytes_per_param_down": summed.nbytes / num,
            **_errors(result, weighted_mean(updates, sizes)),
        }
    )


def previous_context() -> ts.Context:
    """The previous default: N = 8192, [60, 40], scale 2^40, symmetric."""
    context = ts.context(
        ts.SCHEME_TYPE.CKKS,
        poly_modulus_degree=8192,
        coeff_mod_bit_sizes=[60, 40],
        encryption_type=ts.ENCRYPTION_TYPE.SYMMETRIC,
    )
    context.global_scale = 2.0**40
    return context


def bench_previous(
    context: ts.Context, updates: Sequence[np.ndarray], sizes: Sequence[int], repeat: int
) -> dict[str, Any]:
    """The previous setting's TenSEAL calls: each silo encrypts (n_i / S) u_i in chunks of
    N/2 values; the server deserializes and adds (no multiplication); a silo decrypts and
    divides by the plaintext sum of the weights."""
    server = ts.context_from(context.serialize(save_secret_key=False))
    slots = 4096
    total = float(sum(sizes))
    num = updates[0].size
    encrypt_times, aggregate_times, decrypt_times = [], [], []

    def encrypt(u: np.ndarray, n: int) -> list[bytes]:
        scaled = u * (n / total)
        return [
            ts.ckks_vector(context, scaled[k : k + slots].tolist()).serialize()
            for k in range(0, num, slots)
        ]

    def aggregate(sent: list[list[bytes]]) -> list[bytes]:
        out = []
        for k in range(len(sent[0])):
            acc = ts.ckks_vector_from(server, sent[0][k])
            for chunks in sent[1:]:
                acc = acc + ts.ckks_vector_from(server, chunks[k])
            out.append(acc.serialize())
        return out

    def decrypt(chunks: list[bytes]) -> np.ndarray:
        parts = [ts.ckks_vector_from(context, c).decrypt() for c in chunks]
        return np.concatenate([np.asarray(p) for p in parts]) / (sum(sizes) / total)

    for _ in range(repeat):
        sent = []
        for u, n in zip(updates, sizes, strict=True):
            chunks, seconds = _timed(lambda u=u, n=n: encrypt(u, n))
            sent.append(chunks)
            encrypt_times.append(seconds)
        summed, seconds = _timed(lambda sent=sent: aggregate(sent))
        aggregate_times.append(seconds)
        result, seconds = _timed(lambda summed=summed: decrypt(summed))
        decrypt_times.append(seconds)
    return _finish(
        {
            "encrypt_s": statistics.median(encrypt_times),
            "aggregate_s": statistics.median(aggregate_times),
            "decrypt_s": statistics.median(decrypt_times),
            "bytes_per_param_up": sum(map(len, sent[0])) / num,
            "bytes_per_param_down": sum(map(len, summed)) / num,
            **_errors(result, weighted_mean(updates, sizes)),
        }
    )


def bench_nvflare(
    contexts: nvflare_reference.Contexts,
    updates: Sequence[np.ndarray],
    sizes: Sequence[int],
    layout: Layout,
    repeat: int,
) -> dict[str, Any]:
    """NVFlare's default (``nvflare_reference``): one vector per layer weighted by the
    client, the server adds and multiplies by 1 / sum of the weights."""
    num = updates[0].size
    encrypt_times, aggregate_times, decrypt_times = [], [], []

    def layers(u: np.ndarray) -> dict[str, np.ndarray]:
        out, offset = {}, 0
        for spec in layout:
            out[spec.name] = u[offset : offset + spec.size]
            offset += spec.size
        return out

    for _ in range(repeat):
        sent = []
        for u, n in zip(updates, sizes, strict=True):
            upload, seconds = _timed(
                lambda u=u, n=n: nvflare_reference.encrypt(contexts.client, layers(u), n)
            )
            sent.append(upload)
            encrypt_times.append(seconds)
        summed, seconds = _timed(
            lambda sent=sent: nvflare_reference.aggregate(contexts.server, sent, sizes)
        )
        aggregate_times.append(seconds)
        result, seconds = _timed(
            lambda summed=summed: nvflare_reference.decrypt(contexts.client, summed)
        )
        decrypt_times.append(seconds)
    flat = np.concatenate([result[spec.name] for spec in layout])
    return _finish(
        {
            "encrypt_s": statistics.median(encrypt_times),
            "aggregate_s": statistics.median(aggregate_times),
            "decrypt_s": statistics.median(decrypt_times),
            "bytes_per_param_up": sum(map(len, sent[0].values())) / num,
            "bytes_per_param_down": sum(map(len, summed.values())) / num,
            **_errors(flat, weighted_mean(updates, sizes)),
        }
    )


CKKS_SCHEMES = ("NVFlare default", "previous", "new")
"""The CKKS settings of the side-by-side table, in order."""


def compare_ckks(
    kinds: Sequence[str], silo_counts: Sequence[int], repeat: int, keys: CKKSKeys
) -> dict[str, dict[str, Any]]:
    """The three CKKS settings on the same updates: ``{"lenet5/5": {scheme: row}}``."""
    logging.getLogger("tenseal").setLevel(logging.ERROR)
    nvflare = nvflare_reference.make_contexts()
    previous = previous_context()
    out: dict[str, dict[str, Any]] = {}
    for kind, m in [(k, m) for k in kinds for m in silo_counts]:
        updates, sizes, layout = make_updates(kind, m, seed=m)
        runs = repeat if m <= 10 else 1
        out[f"{kind}/{m}"] = {
            "NVFlare default": bench_nvflare(nvflare, updates, sizes, layout, runs),
            "previous": bench_previous(previous, updates, sizes, runs),
            "new": bench_new(keys, updates, sizes, runs),
        }
    return out


# ------------------------------------------------------------------------------- Paillier
def paillier_keys() -> tuple[Any, Any]:
    from phe import paillier

    return paillier.generate_paillier_keypair(n_length=2048)


def bench_paillier_stock(
    public: Any, private: Any, updates: Sequence[np.ndarray], sizes: Sequence[int], sample: int
) -> dict[str, float]:
    """One value per ciphertext (stock FATE): time ``sample`` values, extrapolate."""
    num = updates[0].size
    total = float(sum(sizes))
    index = np.random.default_rng(1).choice(num, size=sample, replace=False)
    weighted = [u[index] * (n / total) for u, n in zip(updates, sizes, strict=True)]
    start = time.perf_counter()
    cts = [[public.encrypt(float(v)) for v in w] for w in weighted]
    encrypt = (time.perf_counter() - start) / len(weighted)
    start = time.perf_counter()
    acc = cts[0]
    for other in cts[1:]:
        acc = [a + b for a, b in zip(acc, other, strict=True)]
    aggregate = time.perf_counter() - start
    start = time.perf_counter()
    values = np.array([private.decrypt(c) for c in acc])
    decrypt = time.perf_counter() - start
    expected = weighted_mean([u[index] for u in updates], sizes)
    error = float(np.abs(values / (sum(sizes) / total) - expected).max())
    scale = num / sample
    ct_bytes = (public.nsquare.bit_length() + 7) // 8
    out = {
        "encrypt_s": encrypt * scale,
        "aggregate_s": aggregate * scale,
        "decrypt_s": decrypt * scale,
        "bytes_per_param_up": float(ct_bytes),
        "bytes_per_param_down": float(ct_bytes),
        "max_abs_error": error,
        "sampled_values": sample,
    }
    out["end_to_end_s"] = out["encrypt_s"] + out["aggregate_s"] + out["decrypt_s"]
    return out


def bench_paillier_packed(
    public: Any,
    private: Any,
    updates: Sequence[np.ndarray],
    sizes: Sequence[int],
    sample_ciphertexts: int,
    bits: int = 16,
) -> dict[str, float]:
    """BatchCrypt-style packing: time ``sample_ciphertexts`` per silo, extrapolate.

    Each silo quantises w_i * u_i to signed ``bits``-bit integers over the common clipping
    range, adds ``2**(bits-1)`` so they are non-negative, and packs them into slots of
    ``bits + ceil(log2 m)`` bits: the sum of m silos stays inside its slot.
    """
    m = len(updates)
    num = updates[0].size
    total = float(sum(sizes))
    width = bits + math.ceil(math.log2(m))
    slots = (public.n.bit_length() - 1) // width
    levels = 2 ** (bits - 1) - 1
    offset = 2 ** (bits - 1)
    weighted_all = [u * (n / total) for u, n in zip(updates, sizes, strict=True)]
    alpha = max(float(np.abs(w).max()) for w in weighted_all)
    count = min(sample_ciphertexts * slots, num)
    weighted = [w[:count] for w in weighted_all]

    def pack(values: np.ndarray) -> list[int]:
        q = (np.rint(values / alpha * levels).astype(np.int64) + offset).tolist()
        out = []
        for start in range(0, len(q), slots):
            acc = 0
            for v in reversed(q[start : start + slots]):
                acc = (acc << width) | v
            out.append(acc)
        return out

    def unpack(number: int, length: int) -> list[int]:
        mask = (1 << width) - 1
        return [(number >> (width * j)) & mask for j in range(length)]

    start = time.perf_counter()
    cts = [[public.raw_encrypt(p) for p in pack(w)] for w in weighted]
    encrypt = (time.perf_counter() - start) / m
    start = time.perf_counter()
    nsquare = public.nsquare
    acc = cts[0]
    for other in cts[1:]:
        acc = [a * b % nsquare for a, b in zip(acc, other, strict=True)]
    aggregate = time.perf_counter() - start
    start = time.perf_counter()
    sums: list[int] = []
    for k, c in enumerate(acc):
        length = min(slots, count - k * slots)
        sums.extend(unpack(private.raw_decrypt(c), length))
    decoded = (np.array(sums, dtype=np.float64) - m * offset) * alpha / levels
    result = decoded / (sum(sizes) / total)
    decrypt = time.perf_counter() - start
    expected = weighted_mean([u[:count] for u in updates], sizes)
    error = float(np.abs(result - expected).max())
    scale = math.ceil(num / slots) / len(acc)
    ct_bytes = (nsquare.bit_length() + 7) // 8
    out = {
        "encrypt_s": encrypt * scale,
        "aggregate_s": aggregate * scale,
        "decrypt_s": decrypt * scale,
        "bytes_per_param_up": ct_bytes / slots,
        "bytes_per_param_down": ct_bytes / slots,
        "max_abs_error": error,
        "values_per_ciphertext": slots,
        "sampled_ciphertexts": len(acc),
    }
    out["end_to_end_s"] = out["encrypt_s"] + out["aggregate_s"] + out["decrypt_s"]
    return out


# ------------------------------------------------------------------------- round overhead
def round_overhead(rounds: int, keydir: Path, slowdowns: Sequence[float]) -> dict[str, Any]:
    """Demo setting in process: plaintext and encrypted LB-BSP, rounds interleaved.

    Both federations run side by side, one round of each in turn (alternating which goes
    first), so that load on a shared machine hits both alike. A round's time is the
    slowest silo's reported ``train-time`` (+ ``he-time``) plus the server's aggregation.
    The modelled overhead uses the same round's measured speeds v_i and HE times h_i:
    LB-BSP balanced rounds take ``X / sum v_i`` (plaintext) and
    ``(X + sum v_i h_i) / sum v_i`` (encrypted: HE is part of each silo's fixed cost).
    """
    setup = SiloSetup(
        dataset="embedded",
        partition="labels:2",
        num_silos=5,
        seed=0,
        model="lenet5",
        slowdowns=tuple(f"{k:g}" for k in slowdowns),
    )
    settings = {
        "initial_batch_size": 48,
        "local_steps": 40,
        "lr": 0.05,
        "fraction_evaluate": 0.0,
        "min_train_nodes": 5,
        "min_available_nodes": 5,
    }
    modes = ("plaintext", "ckks")
    with tempfile.TemporaryDirectory() as folder:
        paths = {mode: Path(folder) / f"{mode}.jsonl" for mode in modes}
        strategies: dict[str, LBBSPFedAvg] = {
            "plaintext": LBBSPFedAvg(telemetry_path=paths["plaintext"], **settings),
            "ckks": EncryptedLBBSPFedAvg(
                public_context=keydir, telemetry_path=paths["ckks"], **settings
            ),
        }
        grids = {
            "plaintext": InProcessGrid(make_client_app(setup), num_nodes=5),
            "ckks": InProcessGrid(
                make_client_app(setup.model_copy(update={"secret_context": str(keydir)})),
                num_nodes=5,
            ),
        }
        torch.manual_seed(0)
        data = silo_data(setup, 0)
        model = build_model("lenet5", input_shape=data.input_shape, num_classes=10)
        arrays = {mode: ArrayRecord(model.state_dict()) for mode in modes}
        server_times: dict[str, list[float]] = {mode: [] for mode in modes}
        for server_round in range(1, rounds + 1):
            order = modes if server_round % 2 else modes[::-1]
            for mode in order:
                strategy, grid = strategies[mode], grids[mode]
                messages = strategy.configure_train(
                    server_round, arrays[mode], ConfigRecord(), grid
                )
                replies = grid.send_and_receive(messages)
                start = time.perf_counter()
                aggregated, _ = strategy.aggregate_train(server_round, replies)
                server_times[mode].append(time.perf_counter() - start)
                if aggregated is not None:
                    arrays[mode] = aggregated
        events = {
            mode: [e for e in read_telemetry(paths[mode]) if e.get("event") == "train"]
            for mode in modes
        }
    steady = slice(2, None)  # from round 3: the balancer has settled
    results: dict[str, Any] = {}
    for mode in modes:
        round_times, he_real, compute, speeds_he = [], [], [], []
        for event, server in zip(events[mode], server_times[mode], strict=True):
            silos = list(event["silos"].values())
            round_times.append(max(s["train-time"] + s.get("he-time", 0.0) for s in silos) + server)
            he_real.extend(s.get("he-time", 0.0) / s["slowdown"] for s in silos)
            compute.extend(s["compute-time"] for s in silos)
            v = [s["samples-processed"] / s["train-time"] for s in silos]
            h = [s.get("he-time", 0.0) for s in silos]
            total = event["total_batch_size"] * settings["local_steps"]
            speeds_he.append(
                (total / sum(v), sum(a * b for a, b in zip(v, h, strict=True)) / sum(v))
            )
        results[mode] = {
            "round_time_steady_s": statistics.median(round_times[steady]),
            "server_aggregation_s": statistics.median(server_times[mode][steady]),
            "he_time_per_silo_real_s": statistics.mean(he_real),
            "compute_time_per_silo_real_s": statistics.mean(compute),
            "bytes_per_round": sum(t.sent_bytes + t.reply_bytes for t in grids[mode].transfers)
            / rounds,
            "_model": speeds_he,
        }
    plain, ckks = results["plaintext"], results["ckks"]
    results["overhead"] = ckks["round_time_steady_s"] / plain["round_time_steady_s"] - 1.0
    modelled = [
        (t_plain + he + ckks["server_aggregation_s"]) / (t_plain + plain["server_aggregation_s"])
        - 1.0
        for t_plain, he in ckks["_model"][steady]
    ]
    results["overhead_modelled"] = statistics.median(modelled)
    for mode in modes:
        results[mode].pop("_model")
    results["rounds"] = rounds
    results["slowdowns"] = list(slowdowns)
    return results


# ----------------------------------------------------------------------------------- main
def _row(name: str, r: dict[str, float]) -> str:
    relative = f"{r['max_rel_error']:.1e}" if "max_rel_error" in r else "-"
    return (
        f"| {name} | {r['encrypt_s']:.4f} | {r['aggregate_s']:.4f} | {r['decrypt_s']:.4f} "
        f"| {r['end_to_end_s']:.3f} | {r['bytes_per_param_up']:.2f} "
        f"| {r['bytes_per_param_down']:.2f} | {r['max_abs_error']:.1e} | {relative} |"
    )


def measure(
    *,
    kinds: Sequence[str] = ("lenet5", "1m"),
    silo_counts: Sequence[int] = (5, 10),
    compare: Sequence[tuple[str, int]] = (("lenet5", 5), ("lenet5", 100), ("1m", 5)),
    repeat: int = 3,
    paillier_values: int = 100,
    paillier_ciphertexts: int = 16,
    rounds: int | None = 8,
    echo: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run the measurements and return the report (``echo`` gets the printed tables).

    Parameters
    ----------
    kinds : sequence of str (default: ("lenet5", "1m"))
        Update sizes for the CKKS / Paillier tables (empty: none).
    silo_counts : sequence of int (default: (5, 10))
        Silos per table.
    compare : sequence of (str, int) (default: LeNet-5 at 5 and 100 silos, 1m at 5)
        Updates and silo counts of the three CKKS settings side by side (empty: none).
    repeat : int (default: 3)
        CKKS repetitions (medians).
    paillier_values : int (default: 100)
        Values timed for stock Paillier (extrapolated).
    paillier_ciphertexts : int (default: 16)
        Ciphertexts per silo timed for packed Paillier (extrapolated).
    rounds : int | None (default: 8)
        Demo rounds of the round-overhead measurement; ``None`` skips it.
    echo : callable (default: print)
        Where the tables go.
    """
    random.seed(0)
    keys = generate_keys()
    if kinds:
        echo("generating a 2048-bit Paillier key ...")
        p_public, p_private = paillier_keys()
    report: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch_threads": torch.get_num_threads(),
        },
        "ckks_config": keys.config.model_dump(mode="json"),
        "ckks_error_bound": keys.config.error_bound,
        "results": {},
    }
    header = (
        "| scheme | encrypt (s/silo) | aggregate (s) | decrypt (s) | end to end (s) "
        "| B/param up | B/param down | max abs error | max error / range |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    report["compare"] = {}
    for kind, m in compare:
        echo(f"\n### CKKS settings side by side: {kind}, {m} silos")
        rows = compare_ckks([kind], [m], repeat, keys)[f"{kind}/{m}"]
        echo(header)
        for name, r in rows.items():
            echo(_row(name, r))
        report["compare"][f"{kind}/{m}"] = rows
    for kind in kinds:
        for m in silo_counts:
            updates, sizes, _ = make_updates(kind, m, seed=m)
            label = f"{kind}, {m} silos, {updates[0].size} parameters"
            echo(f"\n### {label}")
            ckks = bench_new(keys, updates, sizes, repeat)
            stock = bench_paillier_stock(p_public, p_private, updates, sizes, paillier_values)
            packed = bench_paillier_packed(
                p_public, p_private, updates, sizes, paillier_ciphertexts
            )
            rows = {"CKKS": ckks, "Paillier stock": stock, "Paillier packed": packed}
            echo(header)
            for name, r in rows.items():
                echo(_row(name, r))
            ratios = {
                "packed_paillier_over_ckks_end_to_end": packed["end_to_end_s"]
                / ckks["end_to_end_s"],
                "stock_paillier_over_ckks_end_to_end": stock["end_to_end_s"] / ckks["end_to_end_s"],
                "packed_paillier_over_ckks_encrypt": packed["encrypt_s"] / ckks["encrypt_s"],
            }
            echo(
                "CKKS is {:.0f}x faster end to end than packed Paillier, {:.0f}x than stock "
                "Paillier (Paillier extrapolated from {} values / {} ciphertexts)".format(
                    ratios["packed_paillier_over_ckks_end_to_end"],
                    ratios["stock_paillier_over_ckks_end_to_end"],
                    stock["sampled_values"],
                    packed["sampled_ciphertexts"],
                )
            )
            report["results"][f"{kind}/{m}"] = {"rows": rows, "ratios": ratios}

    if rounds is not None:
        echo("\n### round overhead in the demo setting (in process, emulated 16:8:8:4:4)")
        with tempfile.TemporaryDirectory() as folder:
            write_key_files(keys, folder)
            measured = round_overhead(rounds, Path(folder), (1, 2, 2, 4, 4))
        plain, ckks = measured["plaintext"], measured["ckks"]
        echo("| | plaintext | CKKS |\n|---|---|---|")
        for key, fmt in (
            ("round_time_steady_s", "{:.3f}"),
            ("server_aggregation_s", "{:.4f}"),
            ("compute_time_per_silo_real_s", "{:.3f}"),
            ("he_time_per_silo_real_s", "{:.4f}"),
            ("bytes_per_round", "{:.3g}"),
        ):
            echo(f"| {key} | {fmt.format(plain[key])} | {fmt.format(ckks[key])} |")
        echo(
            f"CKKS round overhead over plaintext: {100 * measured['overhead']:.1f}% measured "
            f"(rounds interleaved), {100 * measured['overhead_modelled']:.1f}% modelled from "
            "the encrypted rounds' speeds and HE times"
        )
        report["round_overhead"] = measured
    return report


def main() -> None:
    """Run every measurement, print the tables and ratios, optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--silos", default="5,10", help="silo counts (default: 5,10)")
    parser.add_argument(
        "--models", default="lenet5,1m", help="update sizes: lenet5, 1m (default: both)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="CKKS repetitions (default: 3)")
    parser.add_argument(
        "--paillier-values", type=int, default=100, help="stock Paillier sample (default: 100)"
    )
    parser.add_argument(
        "--paillier-ciphertexts",
        type=int,
        default=16,
        help="packed Paillier ciphertexts sampled per silo (default: 16)",
    )
    parser.add_argument("--rounds", type=int, default=8, help="demo rounds (default: 8)")
    parser.add_argument("--skip-rounds", action="store_true", help="skip the demo rounds")
    parser.add_argument(
        "--skip-compare", action="store_true", help="skip the three CKKS settings side by side"
    )
    parser.add_argument(
        "--skip-micro", action="store_true", help="only the demo rounds (no CKKS/Paillier tables)"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("fl_lbbsp").setLevel(logging.WARNING)
    report = measure(
        kinds=[] if args.skip_micro else [k.strip() for k in args.models.split(",")],
        silo_counts=[int(s) for s in args.silos.split(",")],
        compare=() if args.skip_compare else (("lenet5", 5), ("lenet5", 100), ("1m", 5)),
        repeat=args.repeat,
        paillier_values=args.paillier_values,
        paillier_ciphertexts=args.paillier_ciphertexts,
        rounds=None if args.skip_rounds else args.rounds,
        echo=lambda line: print(line, flush=True),
    )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
