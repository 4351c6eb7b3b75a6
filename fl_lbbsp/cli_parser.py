"""The argument parser of ``fl-lbbsp``: its commands and their flags, and the checks of
single flag values (one line, exit code 2, for a value out of range).

A flag that sets a field of a settings model is made from that field
(:func:`~fl_lbbsp.cli_flags.add_model_flags`); only the CLI's own flags (output paths,
display, a flag folded into another setting) are written here, so a new knob or run
setting needs no edit here. A subcommand's flags are made when it is parsed, so that
``fl-lbbsp --help`` and the key commands import no run's models."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, get_args

from pydantic import BaseModel

from .cli_flags import add_balancing_flags, add_model_flags, value_parser
from .core.silo.narx import NARX

__all__ = ["CKKS_FLAGS", "NARX_FLAGS", "build_parser", "run_flags"]

NARX_FLAGS = ("warmup", "train_every")
"""The :class:`~fl_lbbsp.core.silo.narx.NARX` settings that are flags (``--narx-warmup``),
given to the run as ``estimator_options``."""
CKKS_FLAGS = ("poly_modulus_degree", "coeff_mod_bit_sizes", "scale_bits", "value_bits")
"""The :class:`~fl_lbbsp.crypto.CKKSConfig` fields that are flags of ``keys generate``."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line like every other error of the CLI, and
    its flags made by ``flags(parser)`` when it first parses (a subcommand's, which import
    its models)."""

    def __init__(
        self,
        *args: Any,
        flags: Callable[[argparse.ArgumentParser], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._flags = flags

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: Any = None
    ) -> tuple[Any, list[str]]:
        flags, self._flags = self._flags, None
        if flags is not None:
            flags(self)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fl-lbbsp: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _names(text: str) -> list[str]:
    """``--schemes``: comma-separated names, blanks dropped."""
    return [s.strip() for s in text.split(",") if s.strip()]


def _positives(flag: str, expected: str, *, none: bool = False) -> Callable[[str], list[Any]]:
    """A flag's comma-separated finite positive numbers (``--cpu-quota``), ``-`` / ``none``
    entries too when ``none`` (``--link-mbps``); a usage error naming ``flag`` otherwise."""

    def parse(text: str) -> list[Any]:
        values: list[float | None] = []
        for part in text.split(","):
            word = part.strip().lower()
            try:
                value = None if none and word in {"-", "none"} else float(word)
            except ValueError:
                value = -1.0
            if value is not None and not (0 < value < float("inf")):
                raise argparse.ArgumentTypeError(
                    f"invalid {flag} {text!r:.60}: expected comma-separated finite positive "
                    f"{expected}"
                )
            values.append(value)
        return values

    return parse


def _speeds(text: str) -> list[float]:
    from .runs.config import check_speed_ratio

    try:
        speeds = [float(s) for s in text.split(",") if s.strip()]
        check_speed_ratio(speeds)
    except ValueError as err:
        raise argparse.ArgumentTypeError(
            f"invalid --speeds {text!r:.60}: expected comma-separated finite positive numbers "
            f"like 16,8,8,4,4 ({err})"
        ) from None
    return speeds


def _accuracy(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(
            f"invalid --target-accuracy {text!r:.40}: expected a fraction in (0, 1], e.g. 0.9"
        )
    return value


def _fl_cost_model(text: str) -> str:
    from .clients.emulation import CostModel

    try:
        if len(text.split(",")) < 2:
            raise ValueError("both M and B are needed")
        CostModel.parse(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid --cost-model {text!r:.60}: expected M,B (seconds per sample > 0 and per "
            "step >= 0, finite), optionally ,C,X_MAX, e.g. 0.0004,0.002"
        ) from None
    return text


def _schedules(text: str) -> tuple[str, ...]:
    """``--slowdown-schedules``: one schedule per silo, ``;``-separated, each in order."""
    from .runs.config import check_schedule_order

    try:
        for schedule in text.split(";"):
            check_schedule_order(schedule)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid --slowdown-schedules: {err}") from None
    return tuple(text.split(";"))


def _add_run_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    schemes: str | None,
    target: str,
    out: Path | None,
    **options: dict[str, Any],
) -> None:
    """A run command's flags: one per field of its config ``model`` (:func:`run_flags`;
    ``options`` as :func:`add_model_flags` takes them), ``--scheme`` among its schemes or,
    given ``schemes`` (their default), ``--schemes``, the balancing and narx flags, and the
    CLI's own (the ``hf:`` columns, ``target`` accuracy's help, the output and display)."""
    if schemes is None:
        add_model_flags(parser, model, ["scheme"])
    else:
        choices = " | ".join(get_args(model.model_fields["scheme"].annotation))
        parser.add_argument(
            "--schemes",
            type=_names,
            default=schemes,
            help=f"comma-separated {choices} (default: {schemes})",
        )
    paths = {"encrypt": "KEYDIR", "checkpoint_dir": "DIR", "checkpoint_key": "FILE"}
    given = {name: {"metavar": metavar} for name, metavar in paths.items()}
    add_model_flags(parser, model, run_flags(model), speeds={"type": _speeds}, **given | options)
    parser.add_argument(
        "--hf-image-column",
        default=None,
        metavar="COLUMN",
        help="hf:PATH: the column of images (default: image)",
    )
    parser.add_argument(
        "--hf-label-column",
        default=None,
        metavar="COLUMN",
        help="hf:PATH: the column of class labels (default: label)",
    )
    parser.add_argument("--target-accuracy", type=_accuracy, default=None, help=target)
    parser.add_argument("--out", type=Path, default=out, help="output folder")
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="only print the summary and any warnings (no progress display, no per-round lines)",
    )
    parser.add_argument("--verbose", action="store_true", help="also show Flower's own log")
    narx = parser.add_argument_group(
        "narx", "the narx estimator's settings, with no other estimator"
    )
    unset: dict[str, Any] = {name: {"default": None} for name in NARX_FLAGS}  # given only
    add_model_flags(narx, NARX, NARX_FLAGS, prefix="narx_", **unset)
    add_balancing_flags(parser)


def run_flags(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of a run's config ``model`` that are flags: all but its scheme, output
    folder and balancing knobs (flags of their own) and those the CLI sets by flags of
    its own (``emulate_wait``: ``--no-wait``; ``runtime``: ``--in-process``)."""
    own = {"scheme", "out", "balancing", "emulate_wait", "runtime"}
    return tuple(name for name in model.model_fields if name not in own)


def _add_fl_flags(parser: argparse.ArgumentParser, *, schemes: str | None) -> None:
    """``simulate``'s flags (``schemes`` None: ``--scheme``) or ``compare``'s."""
    from .runs.fl import SimulationConfig

    _add_run_flags(
        parser,
        SimulationConfig,
        schemes=schemes,
        target="accuracy for 'time to target' (default: 90%% of the lower best accuracy)",
        out=None,
        cost_model={"type": _fl_cost_model, "metavar": "M,B[,C,X_MAX]"},
        silo_registry={"metavar": "KEYDIR"},
        slowdown_schedules={"type": _schedules, "metavar": "S;S;..."},
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="emulated silos report k*t without waiting (k-1)*t: same figures, less wall time",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the silos in this process one after the other, without Ray",
    )


def _add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    from .runs.cluster import ClusterConfig

    _add_run_flags(
        parser,
        ClusterConfig,
        schemes="bsp,lbbsp,lbbsp-naive",
        target="accuracy for 'iterations to target' (default: 95%% of BSP's final accuracy)",
        out=Path("runs/cluster"),
    )


def _add_ckks_flags(parser: argparse.ArgumentParser) -> None:
    try:
        from .crypto import CKKSConfig
    except ImportError as err:  # the `he` extra is not installed: one line, exit code 2
        parser.error(str(err))
    parser.add_argument("--out", type=Path, required=True, help="folder for the key files")
    add_model_flags(parser, CKKSConfig, CKKS_FLAGS)
    parser.add_argument("--force", action="store_true", help="replace existing key files")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fl-lbbsp``."""
    parser = _Parser(
        prog="fl-lbbsp", description="LB-BSP straggler-free federated learning on Flower"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser(
        "simulate",
        help="run one scheme on the Simulation Engine",
        flags=lambda simulate: _add_fl_flags(simulate, schemes=None),
    )
    sub.add_parser(
        "compare",
        help="run FedAvg, LB-BSP or baselines on the same setup",
        flags=lambda compare: _add_fl_flags(compare, schemes="fedavg,lbbsp"),
    )
    sub.add_parser(
        "cluster",
        help="parameter-server mode: one synchronous iteration per round",
        flags=_add_cluster_flags,
    )
    _add_deploy_local(sub)
    keys = sub.add_parser("keys", help="CKKS keys for encrypted updates, silos' signing keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    keys_sub.add_parser(
        "generate",
        help="write secret.ckks (silos), public.ckks (server) and fingerprint.txt",
        flags=_add_ckks_flags,
    )
    silos = keys_sub.add_parser(
        "silos",
        help="write one Ed25519 signing key per silo (silo-<id>.key) and registry.json "
        "(silo id -> public key) for the server's --silo-registry",
    )
    silos.add_argument("--out", type=Path, required=True, help="folder for the key files")
    silos.add_argument(
        "--silos", type=int, default=None, help="number of silos, ids 0..N-1 (or --ids)"
    )
    silos.add_argument(
        "--ids", default=None, help="comma-separated silo ids (default: 0..N-1 of --silos)"
    )
    silos.add_argument(
        "--dataset-sizes",
        type=value_parser("--dataset-sizes", tuple[int, ...], optional=False),
        default=None,
        help="each silo's declared dataset size, comma-separated (default: none declared)",
    )
    silos.add_argument("--force", action="store_true", help="replace existing key files")
    checkpoint = keys_sub.add_parser(
        "checkpoint",
        help="write a checkpoint key (256 random bits, mode 0600) for --checkpoint-key",
    )
    checkpoint.add_argument("--out", type=Path, required=True, help="the key file")
    checkpoint.add_argument("--force", action="store_true", help="replace an existing key")
    checkpoint.add_argument(
        "--sign",
        type=Path,
        default=None,
        metavar="DIR",
        help="re-sign the unkeyed checkpoints in DIR under the key already in --out (only "
        "checkpoints you trust: an edit made before is obeyed)",
    )
    return parser


def _add_deploy_local(sub: Any) -> None:
    deploy = sub.add_parser(
        "deploy-local",
        help="start a SuperLink and SuperNodes on 127.0.0.1 (TLS) for `flwr run`",
        description="Start flower-superlink and one flower-supernode per silo on 127.0.0.1 "
        "with free ports, TLS with a locally generated CA (unless --insecure), and print "
        "the `flwr run` command for them. Ctrl-C stops everything.",
    )
    deploy.add_argument("--silos", type=int, default=3, help="SuperNodes (default: 3)")
    deploy.add_argument(
        "--speeds",
        type=_speeds,
        default=None,
        help="emulated relative capacity per silo, e.g. 4,2,1 (default: all equal)",
    )
    deploy.add_argument(
        "--cpu-quota",
        type=_positives("--cpu-quota", "fractions of a core, e.g. 1,0.5,0.25"),
        default=None,
        metavar="Q,Q,...",
        help="real capacity: each silo's SuperNode, its ClientApp processes and its warm "
        "worker run in a CPU group with this quota, a fraction of one core, e.g. "
        "1,0.5,0.25 (needs root and the cgroup cpu controller; silos then compute in "
        "parallel; --speeds still emulates on top)",
    )
    deploy.add_argument(
        "--link-mbps",
        type=_positives("--link-mbps", "Mbit/s or `none`, e.g. none,none,5", none=True),
        default=None,
        metavar="R,R,...",
        help="each silo's link to the SuperLink in Mbit/s through a rate-limited proxy on "
        "127.0.0.1, e.g. 100,100,5 or none,none,5 (`none`: not limited)",
    )
    deploy.add_argument(
        "--workdir",
        type=Path,
        default=Path("runs/deploy"),
        help="certificates, logs and Flower config (default: runs/deploy)",
    )
    deploy.add_argument("--insecure", action="store_true", help="no TLS (plain HTTP on loopback)")
    deploy.add_argument(
        "--parallel-compute",
        action="store_true",
        help="let silos compute at the same time (default: one at a time on this machine)",
    )
    deploy.add_argument(
        "--no-node-auth",
        action="store_true",
        help="let any SuperNode join (default with TLS: Flower's SuperNode authentication, "
        "one key per silo registered with the SuperLink; unknown nodes are refused)",
    )
    deploy.add_argument(
        "--silo-registry",
        metavar="KEYDIR",
        default=None,
        help="signed replies: give each SuperNode its signing-key KEYDIR/silo-<id>.key "
        "from `fl-lbbsp keys silos --ids silo-0,silo-1,...` and the app run config "
        "silo-registry=KEYDIR/registry.json; `auto`: generate them in WORKDIR/silo-keys; "
        "`none`: unsigned replies (default: auto with TLS, none with --insecure)",
    )
    deploy.add_argument(
        "--no-warm-worker",
        action="store_true",
        help="no warm silo worker beside each SuperNode: every ClientApp process (one per "
        "message) imports torch and loads the data and the model itself (default: a warm "
        "worker per silo holds them)",
    )
    deploy.add_argument(
        "--no-restart",
        action="store_true",
        help="leave a SuperNode that dies out (default: log it and start it again)",
    )
    deploy.add_argument(
        "--app",
        type=Path,
        default=None,
        help="run this Flower app on the federation (flwr run --stream), then stop; the "
        "exit code is 0 only if the run ended finished:completed",
    )
    deploy.add_argument(
        "--run-config",
        type=Path,
        default=None,
        help="TOML file of run-config overrides for --app (flwr run --run-config)",
    )
    deploy.add_argument(
        "--run-timeout",
        type=float,
        default=24 * 3600.0,
        help="seconds before the --app run is stopped (default: 86400)",
    )
