"""Configuration: the ``Config`` dataclass and the only place that reads ``OFFRECOMP_*`` variables.

Precedence: keyword argument > ``OFFRECOMP_*`` environment variable > default, except
``OFFRECOMP_DISABLE=1``, which always wins and turns the runtime into a no-op. A ``Config``
built directly is read by the same rule: a field set to other than its default is an
argument, one left at its default is filled from the environment (:meth:`Config.checked`).
Every bad value raises ``ValueError`` naming the variable (or argument), the value and
the accepted forms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import numbers
import operator
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Union

from offrecomp import _torch_compat as tc
from scheduler.units import (
    GBPS,
    INFEASIBLE_POLICIES,
    MAX_OVERHEAD,
    MIN_PREFETCH_REGIONS,
    REPLAY_OP_US,
    SIZE_FORMS,
    NumberRange,
    format_bytes,
    parse_bytes,
)

__all__ = [
    "ENV_VARS",
    "MODES",
    "Budget",
    "Config",
    "format_bytes",
    "parse_bytes",
    "parse_size_or_fraction",
]

Mode = Literal["auto", "keep", "offload", "recompute", "off"]
MODES: tuple[str, ...] = ("auto", "keep", "offload", "recompute", "off")
LOG_LEVELS: tuple[str, ...] = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass(frozen=True)
class Budget:
    """A memory amount given either in bytes or as a fraction of a capacity."""

    nbytes: int | None = None
    fraction: float | None = None

    def resolve(self, capacity_bytes: int) -> int:
        if self.nbytes is not None:
            return self.nbytes
        assert self.fraction is not None
        return int(self.fraction * capacity_bytes)

    def __str__(self) -> str:
        if self.nbytes is not None:
            return format_bytes(self.nbytes)
        return f"{(self.fraction or 0.0) * 100:g}%"


#: What ``parse_size_or_fraction`` accepts, for its errors.
SIZE_OR_FRACTION_FORMS = (
    f"auto or none (automatic), {SIZE_FORMS}, or a percentage of the capacity in (0%, 100%] (60%)"
)


def parse_size_or_fraction(value: object, *, name: str) -> Budget | None:
    """Parse ``None``/``"auto"``/``"none"`` (automatic), a byte count, a unit string, or
    a percentage ``"60%"``."""
    if value is None:
        return None
    if isinstance(value, Budget):  # checked and read as the number or percentage it stands for
        if value.fraction is None and value.nbytes is not None:
            if isinstance(value.nbytes, (str, bool)):
                raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_OR_FRACTION_FORMS}")
            return parse_size_or_fraction(value.nbytes, name=name)
        f = value.fraction
        if value.nbytes is not None or not (isinstance(f, numbers.Real) and not isinstance(f, bool) and 0.0 < f <= 1.0):
            raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_OR_FRACTION_FORMS}")
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("", "auto", "none"):
            return None
        if text.endswith("%"):
            try:
                pct = float(text[:-1])
            except ValueError:
                pct = float("nan")
            if not (0.0 < pct <= 100.0):
                raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_OR_FRACTION_FORMS}")
            return Budget(fraction=pct / 100.0)
    try:
        return Budget(nbytes=parse_bytes(value, name=name))
    except ValueError:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {SIZE_OR_FRACTION_FORMS}") from None


def _parse_bool(value: object, *, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"{name}={value!r} is invalid; accepted: 1, 0, true, false, yes, no, on, off")


def _parse_choice(value: object, *, name: str, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {', '.join(choices)}")
    return text


def _parse_log_level(value: object, *, name: str) -> str:
    """A level as ``logging`` takes it: a name in any case (``"info"``; one registered
    with ``logging.addLevelName`` too) or any number >= 0 (``logging.INFO``, ``"20"``,
    ``15``), stored as its name, or as its digits where the number has none (``"15"``;
    :func:`apply_log_level` turns them back into the number)."""
    forms = f"{', '.join(LOG_LEVELS)} (any case), or a level number >= 0 such as logging.INFO (20)"
    text = str(value).strip()
    number = isinstance(value, int) and not isinstance(value, bool)
    if number or (isinstance(value, str) and text.isascii() and text.isdigit()):
        level = int(text)
        if level >= 0:
            level_name = logging.getLevelName(level)  # "Level 15" for a number without a name
            return level_name if not level_name.startswith("Level ") else str(level)
    elif isinstance(value, str) and text.upper() in (*LOG_LEVELS, "NOTSET"):
        return text.upper()
    elif isinstance(value, str) and text and isinstance(logging.getLevelName(text), int):
        return text  # NOTSET, or a name registered with logging.addLevelName
    raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")


def _parse_float(value: object, *, name: str, lo: float, hi: float, forms: str) -> float:
    return NumberRange(lo, hi, forms).parse(value, name=name)


def _parse_int(value: object, *, name: str, lo: int, forms: str) -> int:
    if isinstance(value, bool):
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
    try:
        x = operator.index(value) if isinstance(value, numbers.Integral) else int(str(value).strip())
    except ValueError:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}") from None
    if x < lo:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
    return x


@dataclass(frozen=True)
class Prefetch:
    """How far ahead backward reloads are issued: a number of regions or a byte window."""

    regions: int | None = None
    nbytes: int | None = None

    def __str__(self) -> str:
        if self.regions is not None:
            return f"{self.regions} region{'s' if self.regions != 1 else ''}"
        return format_bytes(self.nbytes or 0)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _parse_prefetch(value: object, *, name: str) -> Prefetch:
    forms = f"a number of regions, {MIN_PREFETCH_REGIONS} or more (2), or a byte window with a unit (256MiB)"
    if isinstance(value, Prefetch):  # checked as the count or window it stands for
        if (value.regions is None) == (value.nbytes is None):
            raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
        if value.regions is not None:
            if not isinstance(value.regions, numbers.Integral):
                raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
            return _parse_prefetch(value.regions, name=name)
        if isinstance(value.nbytes, bool) or not isinstance(value.nbytes, numbers.Integral) or value.nbytes <= 0:
            raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
        return value
    if isinstance(value, (bool, float)):  # a float is neither a count nor a size with a unit
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
    if isinstance(value, numbers.Integral):  # numpy.int64 too
        if value < MIN_PREFETCH_REGIONS:
            raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
        return Prefetch(regions=operator.index(value))
    if isinstance(value, str) and value.strip().isdigit():
        if int(value.strip()) < MIN_PREFETCH_REGIONS:
            raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
        return Prefetch(regions=int(value.strip()))
    if isinstance(value, str) and _is_number(value):  # not a count of regions, and no unit
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
    try:
        nbytes = parse_bytes(value, name=name)
    except ValueError:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}") from None
    if nbytes <= 0:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {forms}")
    return Prefetch(nbytes=nbytes)


RegionSpec = Union[  # noqa: UP007 - a runtime alias, kept readable on Python 3.10
    None,
    type,
    tuple[type, ...],
    list[type],
    Callable[[Any, str], bool],
]


@dataclass(kw_only=True)
class Config:
    """Everything that tunes the runtime. Build it with :meth:`Config.resolve`."""

    disable: bool = False
    """Make the runtime a transparent no-op (no hooks installed). ``OFFRECOMP_DISABLE``."""
    mode: str = "auto"
    """``auto`` (planner decides), ``keep``, ``offload``, ``recompute`` (force one placement
    wherever legal) or ``off`` (hooks not installed). ``OFFRECOMP_MODE``."""
    budget: Budget | None = None
    """Device bytes allowed for activations: bytes, unit string or a percentage of device
    memory; None = automatic (as an argument, ``"auto"`` or ``"none"`` chooses automatic
    over ``OFFRECOMP_BUDGET``; None or ``""`` leaves it to the variable). ``OFFRECOMP_BUDGET``."""
    host_limit: Budget | None = None
    """Most pinned host memory the offload pool may hold: bytes (above 0), unit string or a
    percentage of available host memory; None = a safe share of available memory divided
    by the ranks on this node. ``OFFRECOMP_HOST_LIMIT``."""
    min_bytes: int = 64 * 1024
    """Storages smaller than this are never offloaded, and plans keep them (forced
    ``recompute`` still drops them with their region). ``OFFRECOMP_MIN_BYTES``."""
    prefetch: Prefetch = field(default_factory=lambda: Prefetch(regions=2))
    """How far ahead backward reloads are issued. ``OFFRECOMP_PREFETCH``."""
    report_path: str | None = None
    """JSON-lines file, one record per step. ``OFFRECOMP_REPORT``."""
    verify: bool = False
    """Check that replayed tensors equal the originals (debug; costs a checksum per save).
    ``OFFRECOMP_VERIFY``."""
    native_keep: bool = True
    """Region calls the forced ``keep`` mode keeps whole, and those auto's plans keep whole,
    save through autograd's own saved variables, the runtime's hooks off (NOTE [Native
    keep]). ``OFFRECOMP_NATIVE_KEEP``."""
    log_level: str | None = None
    """Level of the ``offrecomp`` logger: a name (``"INFO"``, any case) or a number
    (``logging.INFO``), kept as its name; None: leave the logger alone. ``OFFRECOMP_LOG``."""
    max_overhead: float | None = None
    """Step-time overhead the user accepts (0.05 = 5%); with ``budget=None`` the planner buys
    as much memory as this overhead allows. ``OFFRECOMP_MAX_OVERHEAD``."""
    profile_path: str | None = None
    """Save the measured profile of each new signature here, for what-if planning.
    ``OFFRECOMP_PROFILE``."""
    d2h_gbps: float | None = None
    """Device-to-host bandwidth to plan with before it is measured (GB/s).
    ``OFFRECOMP_D2H_GBPS``."""
    h2d_gbps: float | None = None
    """Host-to-device bandwidth to plan with before it is measured (GB/s).
    ``OFFRECOMP_H2D_GBPS``."""
    budget_margin: float = 0.05
    """Share of device capacity held back when ``budget`` is automatic: the budget is
    capacity x (1 - margin) less what the rest of training needed (on the CPU, of
    available memory). ``OFFRECOMP_BUDGET_MARGIN``."""
    infeasible: str = "warn"
    """What to do when the budget cannot be met: ``warn`` (run the most frugal plan) or
    ``error``. ``OFFRECOMP_INFEASIBLE``."""
    drift: float = 0.25
    """Relative change that triggers a re-plan: of the plan's prediction under the
    latest estimate from the one it was solved with, or of the median measured step
    time of a window of steps from its prediction (8 steps; doubling while the host's load
    makes most windows drift: NOTE [Drift]). ``OFFRECOMP_DRIFT``."""
    plan_cache_size: int = 8
    """Most input signatures whose plans are cached. ``OFFRECOMP_PLAN_CACHE``."""
    replay_op_us: float | None = None
    """Microseconds a replay under the dispatch mode costs per op it sees; None: learnt
    from the replays that run, starting at 25. A number pins it (0: always skip what can
    be skipped; large: always replay plainly). ``OFFRECOMP_REPLAY_OP_US``."""
    regions: RegionSpec = None
    """Region selection: None (repeated children of ModuleList/Sequential/ModuleDict), module types,
    or ``fn(module, qualified_name) -> bool``. Argument only."""

    sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    """Where each field came from: ``argument``, ``env`` or ``default``."""
    _parsed: dict[str, Any] = field(default_factory=dict, init=False, compare=False, repr=False)
    """The value each field's parser gave it, by field (empty in a config built or
    replaced directly): :meth:`checked` passes over a field that still holds it."""

    # ----------------------------------------------------------------- building

    @classmethod
    def resolve(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Config:
        """Build a config from keyword overrides, ``OFFRECOMP_*`` variables and defaults."""
        env = os.environ if environ is None else environ
        overrides = dict(overrides or {})
        known = {f.name for f in dataclasses.fields(cls)} - {"sources", "_parsed"}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(
                f"unknown offrecomp option(s) {', '.join(unknown)}; accepted: {', '.join(sorted(known))}"
            )
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        for fname, (var, parser) in _FIELD_PARSERS.items():
            in_env = var in env and env[var].strip() != ""
            if fname in overrides and not _not_given(overrides[fname]):
                values[fname] = parser(overrides[fname], name=fname)
                sources[fname] = "argument"
                if in_env and var != "OFFRECOMP_DISABLE":  # unused, but a mistake all the same (DISABLE's raises below)
                    try:
                        parser(env[var], name=var)
                    except ValueError as exc:
                        logging.getLogger("offrecomp").warning(
                            "offrecomp: %s (the argument %s=%r is used instead)", exc, fname, overrides[fname]
                        )
            elif in_env:
                values[fname] = parser(env[var], name=var)
                sources[fname] = "env"
            else:
                sources[fname] = "default"
        if "regions" in overrides:
            values["regions"] = overrides["regions"]
            sources["regions"] = "argument"
        _warn_unknown_variables(env)
        local_world_size(env)  # a bad LOCAL_WORLD_SIZE is told now, not when the pool is made
        if _disabled_by(env):  # whatever the arguments say
            values["disable"] = True
            sources["disable"] = "env"
        _refuse_one_file_for_two_outputs(values, sources)
        cfg = cls(**values)
        cfg.sources = sources
        cfg._parsed = {fname: getattr(cfg, fname) for fname in _FIELD_PARSERS}
        return cfg

    def checked(self, *, environ: Mapping[str, str] | None = None) -> Config:
        """This config as the runtime uses it, ``OFFRECOMP_DISABLE=1`` applied whatever it
        says (the rollback switch reaches a config built in code too).

        One built directly (no ``sources``, as ``Config(budget="4MiB")``) is resolved with
        its fields as the arguments: those set to other than their default, which win over
        the environment; the rest are left to it, as an argument not given is. So a field
        set to its default value is not told from one left alone.

        One ``resolve`` made has each field changed since (``dataclasses.replace``, an
        attribute written) through its parser, as an argument: a bad value raises naming
        the field, the value and the accepted forms, before any step runs. A field still
        holding the value a parser gave it is passed over: parsing a path opens its file,
        which ``resolve`` did already."""
        env = os.environ if environ is None else environ
        if not self.sources:
            return Config.resolve(self._set_fields(), environ=env)
        parsed = self._parsed
        values: dict[str, Any] = {}
        sources = dict(self.sources)  # a replaced config shares its original's dict
        for fname, (_, parser) in _FIELD_PARSERS.items():
            value = getattr(self, fname)
            if fname in parsed and parsed[fname] is value:
                values[fname] = value
                continue
            values[fname] = None if value is None else parser(value, name=fname)
            sources[fname] = "argument"
        _refuse_one_file_for_two_outputs(values, sources)
        if _disabled_by(env):
            values["disable"] = True
            sources["disable"] = "env"
        out = dataclasses.replace(self, **values, sources=sources)
        out._parsed = values
        return out

    def _set_fields(self) -> dict[str, Any]:
        """The fields of a config built directly that hold other than their default."""
        given: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name in ("sources", "_parsed"):
                continue
            value = getattr(self, f.name)
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if not (value is default or (type(value) is type(default) and value == default)):
                given[f.name] = value
        return given

    @property
    def active(self) -> bool:
        """True when hooks are installed at all."""
        return not self.disable and self.mode != "off"

    def describe(self) -> str:
        """One line per setting with its source, for the INFO log."""
        parts = []
        for f in dataclasses.fields(self):
            if f.name in ("sources", "_parsed"):
                continue
            val = getattr(self, f.name)
            if callable(val) and not isinstance(val, type):
                val = getattr(val, "__name__", "fn")
            parts.append(f"{f.name}={val} ({self.sources.get(f.name, 'default')})")
        return ", ".join(parts)


def _disabled_by(env: Mapping[str, str]) -> bool:
    """``OFFRECOMP_DISABLE`` set true (a bad value raises, whatever the arguments say)."""
    raw = env.get("OFFRECOMP_DISABLE", "").strip()
    return bool(raw) and _parse_bool(raw, name="OFFRECOMP_DISABLE")


def _not_given(value: object) -> bool:
    """An argument of None or an empty string is not given, as an empty variable is unset:
    ``runtime(m, budget=args.budget or "")`` leaves ``OFFRECOMP_BUDGET`` in force."""
    return value is None or (isinstance(value, str) and not value.strip())


def _opt_path(value: object, *, name: str) -> str | None:
    """A file the runtime writes: its folder must exist, it must not be a folder, and it
    must open for writing (told now, not in the middle of a step; a file this check
    creates is removed again)."""
    text = os.fspath(value) if isinstance(value, os.PathLike) else value
    if not isinstance(text, str):
        raise ValueError(f"{name}={value!r} is invalid; accepted: a file path")
    path = text.strip()
    if not path:
        return None
    if os.path.isdir(path):
        raise ValueError(f"{name}={value!r} is a directory; accepted: a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{name}={value!r} is invalid: its directory {folder!r} does not exist")
    probe = tc.per_rank_path(path)  # this rank's file: another rank's may be open (NOTE [Files per rank])
    existed = os.path.exists(probe)
    try:
        with open(probe, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise ValueError(f"{name}={value!r} cannot be written: {exc.strerror or exc}") from exc
    if not existed:
        with contextlib.suppress(OSError):
            os.remove(probe)
    return path


# NOTE [Files per rank]
# Under torchrun every rank reads the same ``OFFRECOMP_REPORT`` and ``OFFRECOMP_PROFILE``.
# Appended to by each, one report would interleave the ranks' steps (records name no
# rank, and the report command splits runs where step numbers fall back, into runs of
# both ranks' steps), and profiles written over each other at once would leave one
# rank's JSON followed by the tail of another's. So rank 0 (or a process without a
# process group) writes the path given, and rank N the path with ``.rankN`` before its
# suffix (``run.jsonl``: ``run.rank1.jsonl``). The rank is read when the report opens
# (the runtime's first entry) and at each profile save: the default process group's, or
# before one is made torchrun's ``RANK`` and ``WORLD_SIZE`` (``per_rank_path`` in
# _torch_compat.py); a launcher that sets neither and makes the group inside the first
# entry writes that entry's steps to rank 0's report. A profile is written whole (a file
# beside it moved over it, a symlink's target written, the umask kept for a new one), so
# no reader sees half of it.


def _refuse_one_file_for_two_outputs(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    """The report appends lines and the profile save rewrites its whole file: one file for
    both would lose the report and leave neither readable."""
    report, profile = values.get("report_path"), values.get("profile_path")
    if report is None or profile is None or os.path.realpath(report) != os.path.realpath(profile):
        return
    names = [
        _FIELD_PARSERS[fname][0] if sources.get(fname) == "env" else fname
        for fname in ("report_path", "profile_path")
    ]
    raise ValueError(
        f"{names[0]}={report!r} and {names[1]}={profile!r} name the same file "
        f"{os.path.realpath(report)!r}; accepted: two different files (the profile save would "
        "overwrite the report)"
    )


def _budget(value: object, *, name: str) -> Budget | None:
    return parse_size_or_fraction(value, name=name)


#: What ``host_limit`` accepts, for its errors.
HOST_LIMIT_FORMS = (
    f"auto or none (the default share), a size above 0 as {SIZE_FORMS}, or a percentage of available "
    "host memory in (0%, 100%] (25%); to offload nothing, use mode='keep' or mode='recompute'"
)


def _host_limit(value: object, *, name: str) -> Budget | None:
    """A host limit: a budget of host memory above 0. A pool that may hold no bytes would
    refuse every offload, and auto's planner reads a limit of 0 as none at all
    (``Profile.host_limit_bytes``), so its plans would offload what the pool then turns
    away; a share of 0% is refused as for ``budget``, and 0 bytes with it."""
    try:
        limit = parse_size_or_fraction(value, name=name)
    except ValueError:
        raise ValueError(f"{name}={value!r} is invalid; accepted: {HOST_LIMIT_FORMS}") from None
    amount = None if limit is None else limit.nbytes if limit.nbytes is not None else limit.fraction
    if amount is not None and not amount > 0:
        raise ValueError(
            f"{name}={value!r} is invalid: a pool of 0 bytes holds no offload; accepted: {HOST_LIMIT_FORMS}"
        )
    return limit


_FIELD_PARSERS: dict[str, tuple[str, Callable[..., Any]]] = {
    "disable": ("OFFRECOMP_DISABLE", _parse_bool),
    "mode": ("OFFRECOMP_MODE", lambda v, name: _parse_choice(v, name=name, choices=MODES)),
    "budget": ("OFFRECOMP_BUDGET", _budget),
    "host_limit": ("OFFRECOMP_HOST_LIMIT", _host_limit),
    "min_bytes": ("OFFRECOMP_MIN_BYTES", parse_bytes),
    "prefetch": ("OFFRECOMP_PREFETCH", _parse_prefetch),
    "report_path": ("OFFRECOMP_REPORT", _opt_path),
    "verify": ("OFFRECOMP_VERIFY", _parse_bool),
    "native_keep": ("OFFRECOMP_NATIVE_KEEP", _parse_bool),
    "log_level": ("OFFRECOMP_LOG", _parse_log_level),
    "max_overhead": ("OFFRECOMP_MAX_OVERHEAD", MAX_OVERHEAD.parse),
    "profile_path": ("OFFRECOMP_PROFILE", _opt_path),
    "d2h_gbps": ("OFFRECOMP_D2H_GBPS", GBPS.parse),
    "h2d_gbps": ("OFFRECOMP_H2D_GBPS", GBPS.parse),
    "budget_margin": (
        "OFFRECOMP_BUDGET_MARGIN",
        lambda v, name: _parse_float(v, name=name, lo=0.0, hi=0.9, forms="a fraction between 0 and 0.9"),
    ),
    "infeasible": (
        "OFFRECOMP_INFEASIBLE",
        lambda v, name: _parse_choice(v, name=name, choices=INFEASIBLE_POLICIES),
    ),
    "drift": (
        "OFFRECOMP_DRIFT",
        lambda v, name: _parse_float(v, name=name, lo=0.01, hi=100.0, forms="a fraction from 0.01 to 100 (0.25)"),
    ),
    "plan_cache_size": (
        "OFFRECOMP_PLAN_CACHE",
        lambda v, name: _parse_int(v, name=name, lo=1, forms="an integer >= 1"),
    ),
    "replay_op_us": ("OFFRECOMP_REPLAY_OP_US", REPLAY_OP_US.parse),
}

#: Every environment variable the runtime reads, for docs and tests.
ENV_VARS: tuple[str, ...] = tuple(var for var, _ in _FIELD_PARSERS.values())

#: The options only ``mode="auto"``'s planner reads: a forced mode places every storage
#: itself, so it sets no budget, solves and caches no plan, measures no profile.
AUTO_ONLY: tuple[str, ...] = (
    "budget", "budget_margin", "max_overhead", "infeasible", "drift", "plan_cache_size",
    "d2h_gbps", "h2d_gbps", "profile_path",
)

def ignored_by(mode: str) -> tuple[str, ...]:
    """The options ``mode`` does not read: ``off`` installs no hooks and reads none but
    the logger's level (``regions`` is checked all the same). Under keep and recompute a
    plan set with ``rt.set_plan()`` may offload: ``prefetch`` and ``host_limit`` apply."""
    if mode == "auto":
        return ()
    if mode == "off":
        return tuple(f for f in _FIELD_PARSERS if f not in ("disable", "mode", "log_level"))
    return AUTO_ONLY


def local_world_size(environ: Mapping[str, str] | None = None) -> int:
    """Ranks sharing this node: ``LOCAL_WORLD_SIZE`` as torchrun sets it (default 1)."""
    env = os.environ if environ is None else environ
    raw = env.get("LOCAL_WORLD_SIZE", "").strip()
    if not raw:
        return 1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(
            f"LOCAL_WORLD_SIZE={raw!r} is invalid; accepted: an integer >= 1 (torchrun sets it)"
        )
    return value


def apply_log_level(cfg: Config) -> None:
    level = cfg.log_level
    if level is not None:
        logging.getLogger("offrecomp").setLevel(int(level) if level.isdigit() else level)


def tell_ignored(cfg: Config) -> None:
    """The options ``cfg.mode`` ignores (:func:`ignored_by`) given all the same, said once
    as the runtime is made: a warning for those given as arguments (or on the Config), an
    INFO line for those from variables. ``OFFRECOMP_DISABLE`` turns everything off
    whatever the options say, so it is not told."""
    if cfg.disable:
        return
    given: dict[str, list[str]] = {}
    for fname in ignored_by(cfg.mode):
        given.setdefault(cfg.sources.get(fname, "default"), []).append(fname)
    why = "it installs no hooks" if cfg.mode == "off" else "options of mode='auto' only"
    log = logging.getLogger("offrecomp")
    if given.get("argument"):
        log.warning(
            "offrecomp: mode=%r ignores %s: %s (docs/tuning.md)",
            cfg.mode, ", ".join(f"{f}={getattr(cfg, f)}" for f in given["argument"]), why,
        )
    if given.get("env"):
        log.info(
            "offrecomp: mode=%r ignores %s: %s",
            cfg.mode, ", ".join(_FIELD_PARSERS[f][0] for f in given["env"]), why,
        )


_warned_variables: set[str] = set()


def _warn_unknown_variables(env: Mapping[str, str]) -> None:
    """An ``OFFRECOMP_*`` variable no option reads (a typo, say) is named once, with the
    closest known one."""
    known = {*ENV_VARS, "OFFRECOMP_DISABLE"}
    for var in sorted(env):
        if var.startswith("OFFRECOMP_") and var not in known and var not in _warned_variables:
            _warned_variables.add(var)
            upper = var.upper()  # OFFRECOMP_mode: OFFRECOMP_MODE, not the nearest by case
            close = [upper] if upper in known else difflib.get_close_matches(upper, sorted(known), n=1)
            logging.getLogger("offrecomp").warning(
                "offrecomp: environment variable %s is not an offrecomp setting and is ignored%s "
                "(docs/tuning.md lists them)",
                var, f"; did you mean {close[0]}?" if close else "",
            )
