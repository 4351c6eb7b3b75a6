"""The argument parser of ``fl-lbbsp`` and the checks of single flag values (one line,
exit code 2, for a value out of range).

The balancing flags are made from the settings models (:func:`add_balancing_flags`):
:class:`~fl_lbbsp.core.settings.BalancingKnobs` in ``--help``,
:class:`~fl_lbbsp.core.settings.Tuning` in ``--help-all``; a new knob needs no edit here."""

from __future__ import annotations

import argparse
import math
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn, Union, get_args, get_origin

from pydantic.fields import FieldInfo

from .core.settings import BalancingKnobs, Tuning

__all__ = ["BALANCING_FLAGS", "TUNING_FLAGS", "add_balancing_flags", "balancing_of", "build_parser"]

BALANCING_FLAGS: tuple[str, ...] = tuple(
    name for name in BalancingKnobs.model_fields if name not in {"balance", "tuning"}
)
"""The user-level knobs that are flags (``--noise-budget`` for ``noise_budget``): every
field of :class:`~fl_lbbsp.core.settings.BalancingKnobs` but ``balance`` (the scheme's)."""
TUNING_FLAGS: tuple[str, ...] = tuple(
    name
    for name in Tuning.model_fields
    if name not in {"check_times", "estimator_options", "allocator_options"}
)
"""The :class:`~fl_lbbsp.core.settings.Tuning` knobs that are flags: all but the runner's
``check_times`` and the option dicts (``--narx-warmup``, ...)."""


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors on one line like every other error of the CLI."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"fl-lbbsp: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def _names(text: str) -> list[str]:
    """``--schemes``: comma-separated names, blanks dropped."""
    return [s.strip() for s in text.split(",") if s.strip()]


def _fractions(text: str) -> list[float]:
    """``--cpu-quota``: comma-separated finite positive numbers."""
    try:
        values = [float(s) for s in text.split(",")]
    except ValueError:
        values = []
    if not values or any(not (0 < v < float("inf")) for v in values):
        raise argparse.ArgumentTypeError(
            f"invalid --cpu-quota {text!r:.60}: expected comma-separated finite positive "
            "fractions of a core, e.g. 1,0.5,0.25"
        )
    return values


def _link_rates(text: str) -> list[float | None]:
    """``--link-mbps``: comma-separated finite positive rates, ``-`` / ``none`` for none."""
    rates: list[float | None] = []
    for part in text.split(","):
        word = part.strip().lower()
        try:
            rate = None if word in {"-", "none"} else float(word)
        except ValueError:
            rate = -1.0
        if rate is not None and not (0 < rate < float("inf")):
            raise argparse.ArgumentTypeError(
                f"invalid --link-mbps {text!r:.60}: expected comma-separated finite positive "
                "Mbit/s or `none`, e.g. none,none,5"
            )
        rates.append(rate)
    return rates


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


def _schedules(text: str) -> str:
    from .runs.config import check_schedule_order

    try:
        for schedule in text.split(";"):
            check_schedule_order(schedule)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"invalid --slowdown-schedules: {err}") from None
    return text


def _add_shared_flags(parser: argparse.ArgumentParser, *, unit: str) -> None:
    """Flags with the same meaning in FL (`simulate`, `compare`) and cluster mode."""
    parser.add_argument(
        "--dataset",
        default="embedded",
        help="embedded | mnist:PATH | cifar10:PATH | hf:PATH (your data: a save_to_disk "
        "folder, a .parquet, .csv, .jsonl/.json or .arrow file, or a folder of such files; "
        "see docs/datasets.md) (default: embedded)",
    )
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
    parser.add_argument("--model", default="lenet5", help="lenet5 | mlp (default: lenet5)")
    parser.add_argument("--seed", type=int, default=0, help="seed (default: 0)")
    parser.add_argument(
        "--narx-warmup",
        type=int,
        default=None,
        metavar="N",
        help="narx: reports per silo predicted by EMA before the network is first trained "
        "(default: 500, the paper's; a run shorter than that is EMA throughout)",
    )
    parser.add_argument(
        "--narx-train-every",
        type=int,
        default=None,
        metavar="N",
        help="narx: retrain the network after every N new reports (default: 10)",
    )
    parser.add_argument(
        "--parallel", type=int, default=1, help=f"{unit} computing at once (default: 1)"
    )
    parser.add_argument(
        "--encrypt",
        type=Path,
        default=None,
        metavar="KEYDIR",
        help=f"CKKS-encrypt the {unit}' updates with the keys of `fl-lbbsp keys generate` in "
        f"KEYDIR (the server only adds ciphertexts; accuracy is evaluated on the {unit})",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the report as JSON here")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="checkpoint every round in DIR/<scheme>; rerunning the same command resumes "
        "from there (default: no checkpoints)",
    )
    parser.add_argument(
        "--checkpoint-key",
        type=Path,
        default=None,
        metavar="FILE",
        help="sign the checkpoints with an HMAC under the key in FILE (from `fl-lbbsp keys "
        "checkpoint`, mode 0600), so that an edited checkpoint is refused (default: a "
        "digest, which detects damage, not edits)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="only print the summary (no progress display, no per-round lines)",
    )
    parser.add_argument("--verbose", action="store_true", help="also show Flower's own log")
    add_balancing_flags(parser)


_SCHEMES = "fedavg | lbbsp | lbbsp-tau | lbbsp-eta | partial"


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    _add_shared_flags(parser, unit="silos")
    parser.add_argument("--silos", type=int, default=5, help="number of silos (default: 5)")
    parser.add_argument(
        "--silo-registry",
        type=Path,
        default=None,
        metavar="KEYDIR",
        help="check every reply's signature against KEYDIR/registry.json from `fl-lbbsp keys "
        "silos --silos N`; silo i signs with KEYDIR/silo-<i>.key (default: silo ids are "
        "believed)",
    )
    parser.add_argument(
        "--speeds",
        type=_speeds,
        default=None,
        help="emulated relative capacity per silo, e.g. 16,8,8,4,4 (default: all equal)",
    )
    parser.add_argument(
        "--partition",
        default="labels:2",
        help="iid | labels:K | dirichlet:ALPHA (default: labels:2)",
    )
    parser.add_argument("--rounds", type=int, default=20, help="rounds (default: 20)")
    parser.add_argument("--local-steps", type=int, default=20, help="tau (default: 20)")
    parser.add_argument("--batch-size", type=int, default=32, help="B_init (default: 32)")
    parser.add_argument("--lr", type=float, default=0.05, help="eta (default: 0.05)")
    parser.add_argument(
        "--target-accuracy",
        type=_accuracy,
        default=None,
        help="accuracy for 'time to target' (default: 90%% of the lower best accuracy)",
    )
    parser.add_argument(
        "--slowdown-schedules",
        type=_schedules,
        default=None,
        help="further slowdown per silo over rounds, ';'-separated, e.g. "
        "'1:1,10:2,20:1;1;1;1;1' halves silo 0's capacity in rounds 10-19 (default: none)",
    )
    parser.add_argument(
        "--partial-replies",
        type=int,
        default=None,
        help="scheme partial: replies aggregated per round (default: all silos but one)",
    )
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="emulated silos report k*t without waiting (k-1)*t: same figures, less wall time",
    )
    parser.add_argument(
        "--cost-model",
        type=_fl_cost_model,
        default=None,
        metavar="M,B[,C,X_MAX]",
        help="emulated step time of the fastest silo, seconds per sample and per step: "
        "silos report tau*k*(M*B_i+B) instead of their measured time; optionally a floor C "
        "and a memory cap X_MAX (default: measured)",
    )
    parser.add_argument(
        "--spend-saved-time",
        action="store_true",
        help="after --rounds, spend the time LB-BSP saved on the equal split (FedAvg's) on "
        "more rounds, as many as fit (default: the same rounds, sooner)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the silos in this process one after the other, without Ray",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``fl-lbbsp``."""
    parser = _Parser(
        prog="fl-lbbsp", description="LB-BSP straggler-free federated learning on Flower"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    simulate = sub.add_parser("simulate", help="run one scheme on the Simulation Engine")
    simulate.add_argument("--scheme", default="lbbsp", help=f"{_SCHEMES} (default: lbbsp)")
    _add_run_flags(simulate)
    compare = sub.add_parser("compare", help="run FedAvg, LB-BSP or baselines on the same setup")
    compare.add_argument(
        "--schemes",
        type=_names,
        default="fedavg,lbbsp",
        help=f"comma-separated {_SCHEMES} (default: fedavg,lbbsp)",
    )
    _add_run_flags(compare)
    _add_cluster_parser(sub)
    _add_deploy_local(sub)
    keys = sub.add_parser("keys", help="CKKS keys for encrypted updates, silos' signing keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    generate = keys_sub.add_parser(
        "generate",
        help="write secret.ckks (silos), public.ckks (server) and fingerprint.txt",
    )
    generate.add_argument("--out", type=Path, required=True, help="folder for the key files")
    generate.add_argument(
        "--poly-modulus-degree", type=int, default=4096, help="ring degree N (default: 4096)"
    )
    generate.add_argument(
        "--coeff-mod-bit-sizes",
        type=_integers("--coeff-mod-bit-sizes", "60,40"),
        default=(60, 40),
        help="data and special prime sizes in bits (default: 60,40)",
    )
    generate.add_argument(
        "--scale-bits", type=int, default=35, help="log2 of the CKKS scale (default: 35)"
    )
    generate.add_argument(
        "--value-bits",
        type=int,
        default=2,
        help="silos refuse to encrypt a value above 2^value-bits in magnitude (default: 2)",
    )
    generate.add_argument("--force", action="store_true", help="replace existing key files")
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
        type=_integers("--dataset-sizes", "600,450"),
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


def _integers(flag: str, example: str) -> Callable[[str], tuple[int, ...]]:
    """A flag's comma-separated integers (``--dataset-sizes 600,450``)."""

    def parse(text: str) -> tuple[int, ...]:
        try:
            return tuple(int(s) for s in text.split(",") if s.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {flag} {text!r}: expected integers like {example}"
            ) from None

    return parse


def _add_cluster_parser(sub: Any) -> None:
    cluster = sub.add_parser(
        "cluster", help="parameter-server mode: one synchronous iteration per round"
    )
    _add_shared_flags(cluster, unit="workers")
    cluster.add_argument(
        "--schemes",
        type=_names,
        default="bsp,lbbsp,lbbsp-naive",
        help="comma-separated bsp | lbbsp | lbbsp-naive (default: all three)",
    )
    cluster.add_argument("--workers", type=int, default=4, help="workers (default: 4)")
    cluster.add_argument(
        "--speeds", type=_speeds, default=None, help="emulated capacity per worker, e.g. 4,2,1,1"
    )
    cluster.add_argument(
        "--data", default="full", help="full | shard: where workers draw samples (default: full)"
    )
    cluster.add_argument("--iterations", type=int, default=100, help="iterations (default: 100)")
    cluster.add_argument(
        "--batch-size", type=int, default=64, help="initial batch per worker (default: 64)"
    )
    cluster.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (default: 0.05)")
    cluster.add_argument("--momentum", type=float, default=0.0, help="SGD momentum (default: 0)")
    cluster.add_argument(
        "--cost-model",
        default=None,
        help="emulated batch time 'm,b,C,x_max' of the fastest worker (default: real compute)",
    )
    cluster.add_argument(
        "--wait", action="store_true", help="wait out the cost model's time (default: report it)"
    )
    cluster.add_argument(
        "--eval-every", type=int, default=5, help="evaluate every N iterations (default: 5)"
    )
    cluster.add_argument(
        "--target-accuracy",
        type=_accuracy,
        default=None,
        help="accuracy for 'iterations to target' (default: 95%% of BSP's final accuracy)",
    )
    cluster.add_argument("--out", type=Path, default=Path("runs/cluster"), help="output folder")


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
        type=_fractions,
        default=None,
        metavar="Q,Q,...",
        help="real capacity: each silo's SuperNode, its ClientApp processes and its warm "
        "worker run in a CPU group with this quota, a fraction of one core, e.g. "
        "1,0.5,0.25 (needs root and the cgroup cpu controller; silos then compute in "
        "parallel; --speeds still emulates on top)",
    )
    deploy.add_argument(
        "--link-mbps",
        type=_link_rates,
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


def add_balancing_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per knob of :data:`BALANCING_FLAGS` (group ``balancing``) and of
    :data:`TUNING_FLAGS` (group ``tuning``, shown by ``--help-all``): its help is the
    knob's description with its default, its value parsed to the knob's type (a choice
    among a ``Literal``'s values, ``none`` for an optional knob, ``--no-NAME`` for a
    switch)."""
    group = parser.add_argument_group(
        "balancing", "what the balancer is allowed to do (fl_lbbsp.core.settings.BalancingKnobs)"
    )
    for name in BALANCING_FLAGS:
        _add_knob(group, name, BalancingKnobs.model_fields[name])
    tuning = parser.add_argument_group(
        "tuning",
        f"{len(TUNING_FLAGS)} more flags: estimator, allocator, fits, change detection, guards "
        "and claim bounds (fl_lbbsp.core.settings.Tuning); --help-all lists them",
    )
    hidden = [
        _add_knob(tuning, name, Tuning.model_fields[name], hide=True) for name in TUNING_FLAGS
    ]
    parser.add_argument(
        "--help-all", action=_HelpAll, hidden=hidden, help="show every flag, the tuning ones too"
    )


def _add_knob(
    group: argparse._ArgumentGroup, name: str, field: FieldInfo, *, hide: bool = False
) -> tuple[argparse.Action, str]:
    """The flag of one knob (its help suppressed when ``hide``), and its help."""
    flag, default = "--" + name.replace("_", "-"), field.default
    shown = "none" if default is None else f"{default:.3g}" if type(default) is float else default
    text = " ".join(str(field.description).replace("``", "").split()).replace("%", "%%")
    text = f"{text} (default: {shown})"
    options: dict[str, Any] = {"default": default, "help": argparse.SUPPRESS if hide else text}
    kind, optional = _kind(field.annotation)
    if kind is bool:
        options["action"] = argparse.BooleanOptionalAction
    elif get_origin(kind) is Literal:
        options["choices"] = get_args(kind)
    else:
        options["type"] = _parse(flag, kind, optional=optional)
        options["metavar"] = name.split("_")[-1].upper()
    return group.add_argument(flag, **options), text


class _HelpAll(argparse.Action):
    """``--help-all``: the help with the hidden flags shown, then exit."""

    def __init__(
        self, option_strings: Sequence[str], dest: str, *, hidden: list[Any], help: str
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)
        self.hidden = hidden

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        for action, text in self.hidden:
            action.help = text
        parser.print_help()
        parser.exit()


def balancing_of(args: argparse.Namespace) -> dict[str, Any]:
    """The knobs given by :func:`add_balancing_flags`' flags, by name."""
    return {name: getattr(args, name) for name in (*BALANCING_FLAGS, *TUNING_FLAGS)}


def _kind(annotation: Any) -> tuple[Any, bool]:
    """A knob's type without ``None``, and whether ``None`` is allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        return kinds[0], len(kinds) < len(get_args(annotation))
    return annotation, False


def _parse(flag: str, kind: Callable[[str], Any], *, optional: bool) -> Callable[[str], Any]:
    """``kind(text)``, or ``None`` for ``none`` when ``optional``; a usage error naming
    ``flag`` otherwise (its bounds are the settings' to check)."""
    expected = f"{getattr(kind, '__name__', 'a value')}{' or none' if optional else ''}"

    def parse(text: str) -> Any:
        if optional and text.strip().lower() == "none":
            return None
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {flag} {text!r:.40}: expected {expected}"
            ) from None

    return parse
