"""Option groups: a set of command-line options declared once, as a frozen dataclass, and used by every
command that takes them.

Each field of a group is one option: `opt(default, "--flag", help=...)` holds what typer needs, and where
the value goes (`to`: the config field it sets, `convert`: how the text becomes that value). A command
takes a group as one parameter annotated with the group's class; `@grouped` puts the group's options in
its place in the signature typer reads (so `--help`, prefixscan.toml keys and parameter sources see the
same flat option names as before) and hands the command one typed group object.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import typer

F = TypeVar("F", bound=Callable[..., Any])
_OPTION = "prefixscan.option"


def opt(default: Any, *decls: str, to: str | None = None, convert: Callable[[Any], Any] | None = None,
        **kwargs: Any) -> Any:
    """A group field that is the option `decls` (typer.Option's arguments): `to` names the config field it
    sets (default: the field's own name), `convert` turns the option's value into the config's."""
    meta = {_OPTION: (decls, kwargs), "to": to, "convert": convert}
    if isinstance(default, list):
        return dataclasses.field(default_factory=list, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def pairs(values: list[str], flag: str = "--field", form: str = "NAME=column.path") -> tuple[tuple[str, str], ...]:
    """The NAME=VALUE pairs of a repeatable option (--field; --lora-path NAME=PATH)."""
    out = []
    for v in values:
        name, sep, path = v.partition("=")
        if not sep or not name or not path:
            raise typer.BadParameter(f"{flag} expects {form}, got {v!r}")
        out.append((name.strip(), path.strip()))
    return tuple(out)


def flag(f: dataclasses.Field[Any]) -> str:
    """The option's first (long) name, as error messages name it."""
    return f.metadata[_OPTION][0][0]


def is_group(cls: Any) -> typing.TypeGuard[type]:
    return dataclasses.is_dataclass(cls) and isinstance(cls, type) and all(
        _OPTION in f.metadata for f in dataclasses.fields(cls))


def parameters(cls: type) -> list[inspect.Parameter]:
    """The group's options as the parameters typer reads: name, resolved type, typer.Option default."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        decls, kwargs = f.metadata[_OPTION]
        default = [] if f.default_factory is not dataclasses.MISSING else f.default
        out.append(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, annotation=hints[f.name],
                                     default=typer.Option(default, *decls, **kwargs)))
    return out


def config_fields(group: Any, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The config fields a group's values set (each option's `to`, through its `convert`), except `skip`."""
    out = {}
    for f in dataclasses.fields(group):
        if f.name in skip:
            continue
        value = getattr(group, f.name)
        convert = f.metadata["convert"]
        out[f.metadata["to"] or f.name] = convert(value) if convert is not None else value
    return out


def grouped(func: F) -> F:
    """Expand the parameters of `func` annotated with an option group into the group's options (in place,
    so `--help` keeps their order) and call `func` with one group object per group parameter."""
    hints = typing.get_type_hints(func)
    sig = inspect.signature(func)
    groups: dict[str, type] = {}
    params: list[inspect.Parameter] = []
    for p in sig.parameters.values():
        cls = hints.get(p.name)
        if is_group(cls):
            groups[p.name] = cls
            params += parameters(cls)
        else:
            params.append(p.replace(annotation=hints.get(p.name, p.annotation),
                                    kind=inspect.Parameter.KEYWORD_ONLY))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{func.__name__}: an option group repeats a parameter name")

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        for name, cls in groups.items():
            kwargs[name] = cls(**{f.name: kwargs.pop(f.name) for f in dataclasses.fields(cls)})
        return func(**kwargs)

    wrapper.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
    wrapper.__annotations__ = {p.name: p.annotation for p in params}
    return wrapper  # type: ignore[return-value]
