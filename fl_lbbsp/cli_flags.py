"""Command-line flags made from settings models: one ``--kebab-name`` flag per pydantic
field, its type, choices, default and help taken from the field (:func:`add_model_flags`),
so that a setting declared once in its model is a flag with no edit of the CLI.
:func:`add_balancing_flags` makes :class:`~fl_lbbsp.core.settings.BalancingKnobs`' flags
for ``--help`` and :class:`~fl_lbbsp.core.settings.Tuning`'s for ``--help-all``. The
commands that use them are laid out in :mod:`fl_lbbsp.cli_parser`."""

from __future__ import annotations

import argparse
import inspect
import re
import types
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .core.settings import BalancingKnobs, Tuning

__all__ = [
    "BALANCING_FLAGS",
    "TUNING_FLAGS",
    "add_balancing_flags",
    "add_model_flags",
    "balancing_of",
    "value_parser",
    "values_of",
]

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


def add_model_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    names: Iterable[str],
    *,
    prefix: str = "",
    hide: bool = False,
    **options: dict[str, Any],
) -> list[tuple[argparse.Action, str]]:
    """One flag per field of ``model`` in ``names`` (``--batch-size`` for ``batch_size``,
    after ``prefix``), and its help (suppressed when ``hide``).

    Its value is parsed to the field's type (a choice among a ``Literal``'s values,
    ``none`` for an optional field, comma-separated items for a tuple, ``--no-NAME`` for a
    switch), its default is the field's, its help the field's description (its docstring,
    or its entry in the model's numpydoc ``Parameters``) with that default; its bounds are
    the model's to check. ``options[name]``: argparse keywords that replace the made ones
    (a parser with a finer message, a metavar).
    """
    docs, made = _parameter_docs(model), []
    for name in names:
        field, given = model.model_fields[name], options.get(name, {})
        text = field.description or docs[name]
        made.append(_add_field(parser, prefix + name, field, text, hide=hide, **given))
    return made


def add_balancing_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per knob of :data:`BALANCING_FLAGS` (group ``balancing``) and of
    :data:`TUNING_FLAGS` (group ``tuning``, shown by ``--help-all``), made as
    :func:`add_model_flags` makes them."""
    group = parser.add_argument_group(
        "balancing", "what the balancer is allowed to do (fl_lbbsp.core.settings.BalancingKnobs)"
    )
    add_model_flags(group, BalancingKnobs, BALANCING_FLAGS)
    tuning = parser.add_argument_group(
        "tuning",
        f"{len(TUNING_FLAGS)} more flags: estimator, allocator, fits, change detection, guards "
        "and claim bounds (fl_lbbsp.core.settings.Tuning); --help-all lists them",
    )
    hidden = add_model_flags(tuning, Tuning, TUNING_FLAGS, hide=True)
    parser.add_argument(
        "--help-all", action=_HelpAll, hidden=hidden, help="show every flag, the tuning ones too"
    )


def _add_field(
    group: argparse.ArgumentParser | argparse._ArgumentGroup,
    name: str,
    field: FieldInfo,
    description: str,
    *,
    hide: bool = False,
    **given: Any,
) -> tuple[argparse.Action, str]:
    """The flag of one field (its help suppressed when ``hide``; argparse keywords
    ``given`` replacing the made ones), and its help."""
    flag, default = "--" + name.replace("_", "-"), field.default
    text = f"{_plain(description)} (default: {_shown(default)})"
    options: dict[str, Any] = {"default": default, "help": argparse.SUPPRESS if hide else text}
    kind, optional = _kind(field.annotation)
    if kind is bool:
        options["action"] = argparse.BooleanOptionalAction
    elif get_origin(kind) is Literal:
        options["choices"] = get_args(kind)
    else:
        options["type"] = value_parser(flag, kind, optional=optional)
        options["metavar"] = name.split("_")[-1].upper()
    return group.add_argument(flag, **{**options, **given}), text


def _parameter_docs(model: type[BaseModel]) -> dict[str, str]:
    """Each field's entry in the numpydoc ``Parameters`` of ``model`` and its bases (the
    model's own winning), by name."""
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__[: model.__mro__.index(BaseModel)]):
        lines = inspect.cleandoc(cls.__dict__.get("__doc__") or "").splitlines()
        name = section = ""
        for line, under in zip(lines, [*lines[1:], ""], strict=True):
            if under and set(under) == {"-"}:
                section, name = line, ""
            elif section == "Parameters" and (head := re.fullmatch(r"(\w+) : .*", line)):
                name, docs[head[1]] = head[1], ""
            elif name and line[:1] in (" ", ""):
                docs[name] += " " + line
            else:
                name = ""
    return docs


def _plain(text: str) -> str:
    """A description as help: one line, no reST markup (``code``, :role:`~a.b.Name` as
    ``Name``), ``%`` escaped for argparse."""
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`|:\w+:`([^`]+)`", lambda m: m[1] or m[2], text)
    return " ".join(text.replace("``", "").split()).replace("%", "%%")


def _shown(default: Any) -> str:
    """A default as help shows it: ``none``, 3 digits of a float, a tuple's items by commas."""
    if default is None:
        return "none"
    if type(default) is float:
        return f"{default:.3g}"
    return ",".join(map(str, default)) if isinstance(default, tuple) else str(default)


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
    return values_of(args, (*BALANCING_FLAGS, *TUNING_FLAGS))


def values_of(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    """The values of the flags :func:`add_model_flags` made of the fields ``names``."""
    return {name: getattr(args, name) for name in names}


def _kind(annotation: Any) -> tuple[Any, bool]:
    """A field's type without ``None`` and its ``Annotated`` constraints, and whether
    ``None`` is allowed."""
    kind, optional = annotation, False
    if get_origin(annotation) in (Union, types.UnionType):
        kinds = [a for a in get_args(annotation) if a is not type(None)]
        kind, optional = kinds[0], len(kinds) < len(get_args(annotation))
    return (get_args(kind)[0] if get_origin(kind) is Annotated else kind), optional


def value_parser(flag: str, kind: Any, *, optional: bool) -> Callable[[str], Any]:
    """``kind(text)`` (a tuple's items from comma-separated text), or ``None`` for
    ``none`` when ``optional``; a usage error naming ``flag`` otherwise (its bounds are
    the model's to check)."""
    item = _kind(get_args(kind)[0])[0] if get_origin(kind) is tuple else None
    name = getattr(item or kind, "__name__", "a value")
    expected = f"{f'comma-separated {name}s' if item else name}{' or none' if optional else ''}"

    def parse(text: str) -> Any:
        if optional and text.strip().lower() == "none":
            return None
        try:
            if item is not None:
                return tuple(item(s) for s in text.split(",") if s.strip())
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"invalid {flag} {text!r:.40}: expected {expected}"
            ) from None

    return parse
