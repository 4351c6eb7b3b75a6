"""Benchmark section ``he``: encrypted aggregation, CKKS against Paillier, and the CKKS
round overhead in the demo setting (``benchmarks/he_overhead.py``), in the report schema.

Run: ``python benchmarks/bench_he.py [--smoke] [--out DIR]``.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

from common import machine, parser
from report import write_section

KEY = "lenet5/5"  # the configuration the goals are stated for


@dataclass(frozen=True)
class Settings:
    """Sizes of one run (full or smoke)."""

    kinds: tuple[str, ...]
    silo_counts: tuple[int, ...]
    compare: tuple[tuple[str, int], ...]
    repeat: int
    paillier_values: int
    paillier_ciphertexts: int
    rounds: int | None


FULL = Settings(
    ("lenet5", "1m"), (5, 10), (("lenet5", 5), ("lenet5", 100), ("1m", 5)), 3, 100, 16, 8
)
SMOKE = Settings(("lenet5",), (5,), (("lenet5", 5),), 1, 4, 2, None)  # no demo rounds: ~30 s

SETTING_NAMES = {
    "NVFlare default": "NVFlare default (N=8192, [60,40,40], 2^40, per layer)",
    "previous": "previous (N=8192, [60,40], 2^40, pre-weighted)",
    "new": "new (N=4096, [60,40], 2^35, seeded, 2 per slot)",
}


def _compare_rows(compare: dict[str, dict[str, Any]]) -> list[list[str]]:
    rows = []
    for key, schemes in compare.items():
        kind, silos = key.split("/")
        for name, r in schemes.items():
            rows.append(
                [
                    f"{kind}, {silos} silos",
                    SETTING_NAMES[name],
                    f"{r['bytes_per_param_up']:.2f}",
                    f"{r['bytes_per_param_down']:.2f}",
                    f"{r['encrypt_s']:.4f}",
                    f"{r['decrypt_s']:.4f}",
                    f"{r['aggregate_s']:.3f}",
                    f"{r['end_to_end_s']:.3f}",
                    f"{r['max_abs_error']:.1e}",
                    f"{r['max_rel_error']:.1e}",
                ]
            )
    return rows


def section(report: dict[str, Any], settings: Settings, smoke: bool) -> dict[str, Any]:
    """The ``he`` section in the benchmark schema, from ``he_overhead.measure``'s report."""
    results = report["results"]
    compare = report["compare"]
    main = results[KEY]["rows"]
    ckks, packed, stock = main["CKKS"], main["Paillier packed"], main["Paillier stock"]
    side = compare[KEY]
    new, previous, flare = side["new"], side["previous"], side["NVFlare default"]
    worst = max(compare.items(), key=lambda item: item[1]["new"]["max_rel_error"])
    rounds = report.get("round_overhead")
    figures: list[dict[str, Any]] = [
        {
            "label": "CKKS ciphertext size, LeNet-5 update (upload)",
            "value": new["bytes_per_param_up"],
            "format": ".2f",
            "unit": "B/param",
            "goal": {"op": "<=", "target": 12.0},
            "note": f"seeded, two values per slot; previous {previous['bytes_per_param_up']:.1f}, "
            f"NVFlare default {flare['bytes_per_param_up']:.1f}; plaintext float32 is 4",
        },
        {
            "label": "CKKS aggregate size, LeNet-5 (download)",
            "value": new["bytes_per_param_down"],
            "format": ".2f",
            "unit": "B/param",
            "goal": None,
            "note": "a sum cannot be seeded: both polynomials travel; previous "
            f"{previous['bytes_per_param_down']:.1f}, NVFlare default "
            f"{flare['bytes_per_param_down']:.1f}",
        },
        {
            "label": "CKKS max error of the weighted average / update range, worst run",
            "value": worst[1]["new"]["max_rel_error"],
            "format": ".1e",
            "unit": "",
            "goal": {"op": "<=", "target": 1e-6},
            "note": f"worst of {', '.join(compare)} ({worst[0]}); absolute "
            f"{worst[1]['new']['max_abs_error']:.1e}, the parameters' bound "
            f"{report['ckks_error_bound']:.1e}",
        },
        {
            "label": "CKKS end to end, LeNet-5, 5 silos, new / previous",
            "value": new["end_to_end_s"] / previous["end_to_end_s"],
            "format": ".2f",
            "unit": "x",
            "goal": {"op": "<=", "target": 1.0},
            "note": f"new {new['end_to_end_s']:.3f} s, previous {previous['end_to_end_s']:.3f} "
            f"s, NVFlare default {flare['end_to_end_s']:.3f} s (encrypt on one silo + the "
            "server's checks, weights and sum + decrypt on one silo)",
        },
        {
            "label": "CKKS speed-up over packed Paillier, end to end",
            "value": packed["end_to_end_s"] / ckks["end_to_end_s"],
            "format": ".0f",
            "unit": "x",
            "goal": {"op": ">=", "target": 20.0},
            "note": f"CKKS {ckks['end_to_end_s']:.3f} s, packed Paillier "
            f"{packed['end_to_end_s']:.2f} s (extrapolated from "
            f"{packed['sampled_ciphertexts']} ciphertexts per silo)",
        },
        {
            "label": "CKKS speed-up over stock Paillier, end to end",
            "value": stock["end_to_end_s"] / ckks["end_to_end_s"],
            "format": ",.0f",
            "unit": "x",
            "goal": None,
            "note": f"one value per ciphertext, extrapolated from {stock['sampled_values']} values",
        },
    ]
    big = compare.get("lenet5/100")
    if big is not None:
        figures.append(
            {
                "label": "CKKS server aggregation, LeNet-5, 100 silos (new)",
                "value": big["new"]["aggregate_s"],
                "format": ".2f",
                "unit": "s",
                "goal": None,
                "note": f"previous {big['previous']['aggregate_s']:.2f} s (additions only), "
                f"NVFlare default {big['NVFlare default']['aggregate_s']:.2f} s; the new "
                "server expands each seed and multiplies by the weight",
            }
        )
    if rounds is not None:
        figures.append(
            {
                "label": "CKKS round overhead over plaintext (demo setting)",
                "value": rounds["overhead"],
                "format": "+.1%",
                "unit": "",
                "goal": None,
                "note": f"steady round {rounds['ckks']['round_time_steady_s']:.3f} s encrypted "
                f"against {rounds['plaintext']['round_time_steady_s']:.3f} s; "
                f"{rounds['overhead_modelled']:+.1%} modelled; reference: 15%",
            }
        )
    rows = []
    for key, result in results.items():
        kind, silos = key.split("/")
        for name, r in result["rows"].items():
            rows.append(
                [
                    f"{kind}, {silos} silos",
                    name,
                    f"{r['encrypt_s']:.3f}",
                    f"{r['aggregate_s']:.3f}",
                    f"{r['decrypt_s']:.3f}",
                    f"{r['end_to_end_s']:.3f}",
                    f"{r['bytes_per_param_up']:.1f}",
                    f"{r['max_abs_error']:.1e}",
                ]
            )
    tables = [
        {
            "title": "Three CKKS settings side by side, one run",
            "columns": [
                "update",
                "setting",
                "B/param up",
                "B/param down",
                "encrypt (s/silo)",
                "decrypt (s/silo)",
                "aggregate (s)",
                "end to end (s)",
                "max abs error",
                "max error / range",
            ],
            "rows": _compare_rows(compare),
        },
        {
            "title": "CKKS (new) against Paillier: encrypt (per silo), aggregate (server), "
            "decrypt (per silo)",
            "columns": [
                "update",
                "scheme",
                "encrypt (s)",
                "aggregate (s)",
                "decrypt (s)",
                "end to end (s)",
                "B/param",
                "max abs error",
            ],
            "rows": rows,
        },
    ]
    if rounds is not None:
        tables.append(
            {
                "title": "Round in the demo setting (median of the steady rounds)",
                "columns": ["", "plaintext", "CKKS"],
                "rows": [
                    [label, fmt.format(rounds["plaintext"][key]), fmt.format(rounds["ckks"][key])]
                    for label, key, fmt in (
                        ("round time (s)", "round_time_steady_s", "{:.3f}"),
                        ("server aggregation (s)", "server_aggregation_s", "{:.4f}"),
                        ("compute per silo, real (s)", "compute_time_per_silo_real_s", "{:.3f}"),
                        ("HE per silo, real (s)", "he_time_per_silo_real_s", "{:.4f}"),
                        ("bytes per round", "bytes_per_round", "{:.3g}"),
                    )
                ],
            }
        )
    config = report["ckks_config"]
    setting = (
        f"{'SMOKE RUN (tiny, not a measurement). ' if smoke else ''}"
        "`benchmarks/he_overhead.py`. Three CKKS settings on the same updates in one run: "
        "NVIDIA FLARE's default (`benchmarks/nvflare_reference.py`, its TenSEAL calls: "
        "N=8192, primes [60, 40, 40], scale 2^40, one vector per layer weighted by the "
        "client, the server adds and multiplies by 1/sum of the weights), this project's "
        "previous setting (TenSEAL, N=8192, [60, 40], 2^40, symmetric, chunks of N/2 "
        "pre-weighted by n_i/S, the server adds) and the new one (SEAL through "
        f"tenseal.sealapi, N={config.get('poly_modulus_degree')}, primes "
        f"{config.get('coeff_mod_bit_sizes')}, scale 2^{config.get('scale_bits')}, seeded "
        "symmetric ciphertexts at the data level, two values per slot, unweighted; the server "
        "checks each, multiplies it by its integer n_i and adds); "
        f"{', '.join(f'{k} at {m} silos' for k, m in settings.compare)}, medians of "
        f"{settings.repeat} (1 at 100 silos). Against Paillier 2048 (python-paillier with "
        "gmpy2), one value per ciphertext (stock FATE) and packed BatchCrypt-style (16-bit "
        "slots with headroom for the sum); Paillier times are extrapolated from a sample of "
        f"{settings.paillier_values} values / {settings.paillier_ciphertexts} ciphertexts per "
        f"silo. Updates: {', '.join(settings.kinds)} (LeNet-5: 61,706 parameters, its initial "
        "weights plus N(0, 0.01) per silo; 1m: 1,000,000 values N(0, 0.05)), dataset sizes "
        f"100..999, {', '.join(map(str, settings.silo_counts))} silos. Round overhead: 5 "
        "silos, LeNet-5 on the embedded digits, tau=40, B_init=48, LB-BSP, capacities "
        "16:8:8:4:4 emulated, a plaintext and an encrypted federation in process, rounds "
        "interleaved, "
        + (f"{settings.rounds} rounds" if settings.rounds else "not run")
        + f". Wall-clock on this machine: {machine()}."
    )
    return {
        "section": "he",
        "title": "Encrypted aggregation: CKKS settings side by side, against Paillier, and the "
        "round overhead",
        "setting": setting,
        "figures": figures,
        "tables": tables,
        "plots": [],
        "notes": [
            "End to end = encrypt on one silo (silos work in parallel) + the server's checks, "
            "weights and sum + decrypt on one silo.",
            "Relative error = max |decrypted - plaintext weighted mean| / (max - min of the "
            "mean). The new parameters bound the absolute error by 8 standard deviations of "
            "a fresh ciphertext's slot noise (docs/encryption.md), whatever the silo count.",
            "The packed Paillier clipping range is the true maximum, which favours Paillier.",
        ],
    }


def main() -> int:
    """Measure, write ``he.json``; without TenSEAL or python-paillier, say so and exit 0."""
    args = parser(__doc__.splitlines()[0]).parse_args()
    settings = SMOKE if args.smoke else FULL
    missing = [m for m in ("tenseal", "phe", "gmpy2") if importlib.util.find_spec(m) is None]
    if missing:
        names = ", ".join(missing)
        print(f"skipping the HE section: {names} not installed (pip install -e '.[dev,bench]')")
        return 0
    logging.getLogger("flwr").setLevel(logging.WARNING)
    logging.getLogger("fl_lbbsp").setLevel(logging.WARNING)
    from he_overhead import measure

    report = measure(
        kinds=settings.kinds,
        silo_counts=settings.silo_counts,
        compare=settings.compare,
        repeat=settings.repeat,
        paillier_values=settings.paillier_values,
        paillier_ciphertexts=settings.paillier_ciphertexts,
        rounds=settings.rounds,
        echo=lambda line: print(line, flush=True),
    )
    path = write_section(section(report, settings, args.smoke), args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
