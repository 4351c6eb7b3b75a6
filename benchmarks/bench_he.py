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
    repeat: int
    paillier_values: int
    paillier_ciphertexts: int
    rounds: int | None


FULL = Settings(("lenet5", "1m"), (5, 10), 3, 100, 16, 8)
SMOKE = Settings(("lenet5",), (5,), 1, 4, 2, None)  # no demo rounds: they take ~30 s


def section(report: dict[str, Any], settings: Settings, smoke: bool) -> dict[str, Any]:
    """The ``he`` section in the benchmark schema, from ``he_overhead.measure``'s report."""
    results = report["results"]
    main = results[KEY]["rows"]
    ckks, packed, stock = main["CKKS [60,40]"], main["Paillier packed"], main["Paillier stock"]
    rounds = report.get("round_overhead")
    figures: list[dict[str, Any]] = [
        {
            "label": "CKKS ciphertext size, LeNet-5 update (upload)",
            "value": ckks["bytes_per_param_up"],
            "format": ".1f",
            "unit": "B/param",
            "goal": {"op": "<=", "target": 35.0},
            "note": f"download {ckks['bytes_per_param_down']:.1f} B/param; plaintext float32 is 4",
        },
        {
            "label": "CKKS max abs error of the weighted average",
            "value": ckks["max_abs_error"],
            "format": ".1e",
            "unit": "",
            "goal": {"op": "<=", "target": 1e-6},
            "note": "against the plaintext weighted average, 5 silos",
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
        {
            "label": "CKKS end to end, LeNet-5 update, 5 silos",
            "value": ckks["end_to_end_s"],
            "format": ".3f",
            "unit": "s",
            "goal": None,
            "note": "encrypt on one silo + the server's checks and sum + decrypt on one silo",
        },
    ]
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
            "title": "Encrypt (per silo), aggregate (server), decrypt (per silo)",
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
        }
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
        "`benchmarks/he_overhead.py`: CKKS (TenSEAL, N="
        f"{config.get('poly_modulus_degree')}, primes {config.get('coeff_mod_bit_sizes')}, "
        f"scale 2^{config.get('scale_bits')}, symmetric) against Paillier 2048 (python-paillier "
        "with gmpy2), one value per ciphertext (stock FATE) and packed BatchCrypt-style (16-bit "
        "slots with headroom for the sum); Paillier times are extrapolated from a sample of "
        f"{settings.paillier_values} values / {settings.paillier_ciphertexts} ciphertexts per "
        f"silo; CKKS medians of {settings.repeat}. Updates: "
        f"{', '.join(settings.kinds)} (LeNet-5: 61,706 parameters; 1m: 1,000,000), "
        f"{', '.join(map(str, settings.silo_counts))} silos. Round overhead: 5 silos, LeNet-5 on "
        "the embedded digits, tau=40, B_init=48, LB-BSP, capacities 16:8:8:4:4 emulated, a "
        "plaintext and an encrypted federation in process, rounds interleaved, "
        + (f"{settings.rounds} rounds" if settings.rounds else "not run")
        + f". Wall-clock on this machine: {machine()}."
    )
    return {
        "section": "he",
        "title": "Encrypted aggregation: CKKS against Paillier, and its round overhead",
        "setting": setting,
        "figures": figures,
        "tables": tables,
        "plots": [],
        "notes": [
            "End to end = encrypt on one silo (silos work in parallel) + the server's checks "
            "and sum + decrypt on one silo.",
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
