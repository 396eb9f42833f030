"""The GPU spec grammar (docs/rules.md#resources-and-gpu-requests): the one parser used by forms, API, admin and engine.

Accepted forms (surrounding whitespace is ignored, model names are matched
case-insensitively through the catalog's aliases):

    ""  / "0"                  no accelerator
    "2"                        two whole cards of any model
    "2(V100)"                  two whole cards of a V100 model
    "1(A100|H100)"             one card, any of the listed models
    "0.5(vgpu)" / "0.5"        half of one shareable card of any model
    "0.5(T4)"                  half a T4
    "1(vgpu)" / "1(T4,vgpu)"   one whole card that must be a shareable (vGPU) card
    "1(16G,50%)"               16 GiB of VRAM and 50% of the cores of one card
    "vram=16Gi,tflops-fp16=100"  vendor-neutral: any model and count with these totals
    "1(A100-80G-1g.10gb)"      one MIG instance of profile 1g.10gb on an A100-80G (card name or alias, "-", profile)
    "1(A100-80G-ts)"           one time-sliced replica of an A100-80G (any replica count the nodes declare)

MIG profiles and time-sliced replicas are catalog models of their own ("partition" mig / time_slice, with the
card model as "parent"): each has its own exchange rate and is placed as a whole unit, never as a fraction.

Sizes take G, Gi, GiB (all read as GiB, as GPU tools report memory) or M, Mi, MiB.
This module has no Django imports: the engine and the simulator use it as is.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal

from apps.clusters.catalog import GPU_CATALOG, MIG_CATALOG

MAX_COUNT = 64
MAX_DECIMALS = 2
VGPU = "vgpu"

_NUMBER = r"\d+(?:\.\d+)?"
_COUNT_RE = re.compile(rf"^{_NUMBER}\Z", re.ASCII)
_NEGATIVE_RE = re.compile(rf"^-\s*{_NUMBER}\Z", re.ASCII)
_SIZE_RE = re.compile(rf"^({_NUMBER})\s*(gib|gi|g|mib|mi|m)\Z", re.IGNORECASE | re.ASCII)
_PERCENT_RE = re.compile(rf"^({_NUMBER})\s*%\Z", re.ASCII)
_MODEL_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._-]*\Z")
_KEYS = ("vram", "tflops-fp16", "tflops-fp32")
# A MIG profile or a time-slice suffix at the end of a model token: "A100-80G-1g.10gb", "a100-ts", "A100-80G-ts4".
_MIG_TOKEN_RE = re.compile(r"^(?P<card>.+?)[-_ ](?P<profile>\d+g\.\d+gb)\Z", re.IGNORECASE)
_TS_TOKEN_RE = re.compile(r"^(?P<card>.+?)[-_ ]ts(?P<replicas>\d*)\Z", re.IGNORECASE)
MIG = "mig"
TIME_SLICE = "time_slice"


class GPUSpecError(ValueError):
    """A GPU spec that does not follow the grammar; the message says what was expected."""


class UnknownGPUModel(GPUSpecError):
    """A model name the catalog does not know; ``token`` is the name as written, ``text`` the whole spec."""

    def __init__(self, message: str, token: str, text: str):
        super().__init__(message)
        self.token, self.text = token, text


@dataclass(frozen=True)
class GPURequest:
    """The accelerator part of a resource request, as parsed from a GPU spec.

    For a vendor-neutral request `count` is 1 (at least one card): how many
    cards it takes depends on the model, see `candidate_models`.
    """

    count: Decimal
    models: tuple[str, ...] = ()
    shared: bool = False
    vram_gib: Decimal | None = None
    cores_percent: int | None = None
    min_vram_gib: Decimal | None = None
    min_tflops_fp16: Decimal | None = None
    min_tflops_fp32: Decimal | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", Decimal(self.count))
        object.__setattr__(self, "models", tuple(sorted(set(self.models))))
        for name in ("vram_gib", "min_vram_gib", "min_tflops_fp16", "min_tflops_fp32"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Decimal(value))
        _check_request(self)

    @property
    def is_none(self) -> bool:
        return self.count == 0

    @property
    def is_fractional(self) -> bool:
        return 0 < self.count < 1

    @property
    def is_vendor_neutral(self) -> bool:
        return any(v is not None for v in (self.min_vram_gib, self.min_tflops_fp16, self.min_tflops_fp32))

    def __str__(self) -> str:
        return format_gpu_spec(self)


def _check_request(req: GPURequest) -> None:
    """Reject field combinations that no spec can express (also guards direct construction)."""
    count = req.count
    if count < 0:
        raise GPUSpecError(f"expected a count of 0 or more, got {_fmt(count)}")
    if count > MAX_COUNT:
        raise GPUSpecError(f"expected at most {MAX_COUNT} cards, got {_fmt(count)}")
    if count >= 1 and count != count.to_integral_value():
        raise GPUSpecError(f"expected a whole number of cards or a fraction below 1, got {_fmt(count)}")
    if -count.normalize().as_tuple().exponent > MAX_DECIMALS:
        raise GPUSpecError(f"expected at most {MAX_DECIMALS} decimal places in the count, got {_fmt(count)}")
    if req.is_vendor_neutral:
        if count != 1 or req.models or req.shared or req.vram_gib is not None or req.cores_percent is not None:
            raise GPUSpecError("expected a vendor-neutral request to have count 1 and nothing else but totals")
        for value in (req.min_vram_gib, req.min_tflops_fp16, req.min_tflops_fp32):
            if value is not None and value <= 0:
                raise GPUSpecError(f"expected vendor-neutral totals above 0, got {_fmt(value)}")
        return
    if count == 0:
        if req.models or req.shared or req.vram_gib is not None or req.cores_percent is not None:
            raise GPUSpecError("expected a count above 0 with a model list or a share; write 0 for no accelerator")
        return
    has_share = req.vram_gib is not None or req.cores_percent is not None
    if (req.is_fractional or has_share) and not req.shared:
        raise GPUSpecError("expected shared=True for a fraction or a memory/compute share")
    if req.is_fractional and has_share:
        raise GPUSpecError("expected either a fraction or a memory/compute share, not both")
    if has_share and count != 1:
        raise GPUSpecError(
            f"expected a count of 1 with a memory/compute share (a share is part of one card), got {_fmt(count)}"
        )
    if req.cores_percent is not None and not 1 <= req.cores_percent <= 100:
        raise GPUSpecError(f"expected a percent from 1 to 100, got {req.cores_percent}%")
    if req.vram_gib is not None and req.vram_gib <= 0:
        raise GPUSpecError(f"expected a memory size above 0, got {_fmt(req.vram_gib)}G")
    for model in req.models:
        if not _MODEL_RE.match(model) or model.strip() != model or model.lower() == VGPU:
            raise GPUSpecError(f"expected a model name such as A100, got {model!r}")


NO_GPU = GPURequest(count=Decimal(0))


# --- catalog ---------------------------------------------------------------------------------


def _key(token: str) -> str:
    return re.sub(r"[-_ ]", "", token).lower()


def _dec(value: object) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _get(entry: object, name: str, default: object = None) -> object:
    if isinstance(entry, Mapping):
        return entry.get(name, default)
    return getattr(entry, name, default)


@dataclass(frozen=True)
class CatalogEntry:
    """One GPU model as the parser and the equivalents maths see it."""

    name: str
    vendor: str
    aliases: tuple[str, ...]
    vram_gib: Decimal
    tflops_fp16: Decimal | None
    tflops_fp32: Decimal | None
    exchange_rate: Decimal
    shareable: bool
    partition: str = ""  # "mig" / "time_slice" for a unit of a partitioned card, "" for a card
    parent: str = ""  # the card model of a MIG profile or a time-sliced replica
    replicas: int = 0  # time-sliced: how many replicas share one card


class Catalog:
    """GPU models by canonical name, with alias lookup (case, '-', '_' and spaces ignored).

    Entries are dicts or objects with the keys of `apps.clusters.catalog.GPU_CATALOG`;
    ones with `enabled` False are left out. A TFLOPS figure of 0 or None means unknown.
    """

    def __init__(self, entries: Iterable[Mapping | object]) -> None:
        self._entries: dict[str, CatalogEntry] = {}
        self._by_key: dict[str, list[str]] = {}
        for raw in entries:
            if _get(raw, "enabled", True) is False:
                continue
            aliases = _get(raw, "aliases") or ()
            if isinstance(aliases, str):
                aliases = [a for a in aliases.split(",") if a.strip()]
            entry = CatalogEntry(
                name=str(_get(raw, "name")),
                vendor=str(_get(raw, "vendor", "")),
                aliases=tuple(a.strip() for a in aliases),
                vram_gib=_dec(_get(raw, "vram_gib", 0)) or Decimal(0),
                tflops_fp16=_dec(_get(raw, "tflops_fp16")),
                tflops_fp32=_dec(_get(raw, "tflops_fp32")),
                exchange_rate=_dec(_get(raw, "exchange_rate", 1)),
                shareable=bool(_get(raw, "shareable", False)),
                partition=str(_get(raw, "partition", "") or ""),
                parent=str(_get(raw, "parent", "") or ""),
                replicas=int(_get(raw, "replicas", 0) or 0),
            )
            if not _MODEL_RE.match(entry.name) or entry.name.lower() == VGPU:
                raise ValueError(f"GPU model name {entry.name!r} cannot be written in a GPU spec")
            if entry.name in self._entries:
                raise ValueError(f"GPU model {entry.name!r} is in the catalog twice")
            self._entries[entry.name] = entry
            for token in {_key(entry.name), *(_key(a) for a in entry.aliases)}:
                self._by_key.setdefault(token, []).append(entry.name)
        for name in self._entries:
            if len(self._by_key[_key(name)]) > 1:
                others = [n for n in self._by_key[_key(name)] if n != name]
                raise ValueError(f"GPU model name {name!r} is also an alias of {', '.join(others)}")

    @classmethod
    def default(cls) -> Catalog:
        """The catalog of the seed data in `apps.clusters.catalog` (shared, do not mutate)."""
        return _default_catalog()

    def __iter__(self) -> Iterator[CatalogEntry]:
        return iter(self._entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def names(self) -> list[str]:
        return list(self._entries)

    def resolve_all(self, token: str) -> tuple[str, ...]:
        """Every canonical name that `token` (a name or alias) may mean; () when unknown."""
        return tuple(sorted(self._by_key.get(_key(token.strip()), ())))

    def resolve(self, token: str) -> str | None:
        """The canonical name for `token`, or None when unknown or ambiguous (see resolve_all)."""
        names = self.resolve_all(token)
        return names[0] if len(names) == 1 else None

    def entry(self, name: str) -> CatalogEntry:
        """The entry for a canonical name or an unambiguous alias; KeyError when unknown."""
        resolved = name if name in self._entries else self.resolve(name)
        if resolved is None:
            raise KeyError(name)
        return self._entries[resolved]

    def shareable(self, name: str) -> bool:
        return self.entry(name).shareable

    def rate(self, name: str) -> float:
        return float(self.entry(name).exchange_rate)

    def units_of(self, card: str, partition: str) -> list[CatalogEntry]:
        """The MIG profiles (``partition`` "mig") or time-sliced replicas ("time_slice") of a card model."""
        return [e for e in self if e.partition == partition and e.parent == card]

    def suggestions(self, token: str, limit: int = 5) -> list[str]:
        """Known names close to a mistyped token, else the first few names."""
        keys = difflib.get_close_matches(_key(token), list(self._by_key), n=limit, cutoff=0.6)
        close = sorted({name for k in keys for name in self._by_key[k]})
        return (close or self.names)[:limit]


@functools.cache
def _default_catalog() -> Catalog:
    return Catalog([*GPU_CATALOG, *MIG_CATALOG])


# --- parsing ---------------------------------------------------------------------------------


def _fmt(value: Decimal) -> str:
    return format(value.normalize(), "f")


def _decimal_literal(literal: str, what: str, text: str) -> Decimal:
    digits = literal.partition(".")[2]
    if len(digits) > MAX_DECIMALS:
        raise GPUSpecError(f"expected at most {MAX_DECIMALS} decimal places in {what}, got {literal!r} in {text!r}")
    return Decimal(literal)


def _parse_size(item: str, text: str) -> Decimal | None:
    """GiB for a size such as 16G / 16Gi / 16GiB / 512Mi, None when `item` is not a size."""
    match = _SIZE_RE.match(item)
    if not match:
        return None
    value = _decimal_literal(match.group(1), "a size", text)
    if match.group(2).lower().startswith("m"):
        value /= 1024
    if value <= 0:
        raise GPUSpecError(f"expected a memory size above 0, got {item!r} in {text!r}")
    return value


def parse_gpu_spec(text: str | None, catalog: Catalog | None = None) -> GPURequest:
    """Parse a GPU spec; with a catalog, model names are resolved and sharing rules checked."""
    spec = (text or "").strip()
    if not spec:
        return NO_GPU
    if "=" in spec:
        if "(" in spec or ")" in spec:
            raise GPUSpecError(f"expected either a form like 2(V100) or key=value pairs, not both, in {spec!r}")
        return _parse_vendor_neutral(spec, catalog)
    if spec.count("(") > 1:
        raise GPUSpecError(f"unexpected second '(' in {spec!r}")
    if spec.count(")") > 1:
        raise GPUSpecError(f"unexpected second ')' in {spec!r}")
    if ")" in spec and "(" not in spec:
        raise GPUSpecError(f"unexpected ')' without a matching '(' in {spec!r}")
    if "(" in spec:
        head, _, rest = spec.partition("(")
        if ")" not in rest:
            raise GPUSpecError(f"expected ')' to close '(' in {spec!r}")
        inner, _, tail = rest.partition(")")
        if tail.strip():
            raise GPUSpecError(f"expected nothing after ')', got {tail.strip()!r} in {spec!r}")
        count = _parse_count(head.strip(), spec, before_paren=True)
        return _parse_inner(count, inner, spec, catalog)
    if _COUNT_RE.match(spec) or _NEGATIVE_RE.match(spec):
        count = _parse_count(spec, spec, before_paren=False)
        if count == 0:
            return NO_GPU
        return _build(count, (), count < 1, None, None, spec, catalog)
    if _MODEL_RE.match(spec):
        raise GPUSpecError(f"expected a count before the model, such as 1({spec}), in {spec!r}")
    raise GPUSpecError(
        f"expected a count such as 2, a form such as 2(V100), or key=value pairs such as vram=16Gi, in {spec!r}"
    )


def _parse_count(literal: str, text: str, *, before_paren: bool) -> Decimal:
    if _NEGATIVE_RE.match(literal):
        raise GPUSpecError(f"expected a count of 0 or more, got {literal!r} in {text!r}")
    if not _COUNT_RE.match(literal):
        where = " before '('" if before_paren else ""
        raise GPUSpecError(f"expected a count such as 2 or 0.5{where} in {text!r}")
    count = _decimal_literal(literal, "the count", text)
    if count > MAX_COUNT:
        raise GPUSpecError(f"expected at most {MAX_COUNT} cards, got {literal} in {text!r}")
    if count >= 1 and count != count.to_integral_value():
        raise GPUSpecError(f"expected a whole number of cards or a fraction below 1, got {literal} in {text!r}")
    return count


def _parse_inner(count: Decimal, inner: str, text: str, catalog: Catalog | None) -> GPURequest:
    if not inner.strip():
        raise GPUSpecError(f"expected a model name, vgpu or a share such as 16G,50% inside '()' in {text!r}")
    models: tuple[str, ...] | None = None
    vgpu = False
    vram: Decimal | None = None
    percent: int | None = None
    for raw in inner.split(","):
        item = raw.strip()
        if not item:
            raise GPUSpecError(f"expected an item between commas inside '()' in {text!r}")
        if _PERCENT_RE.match(item):
            if percent is not None:
                raise GPUSpecError(f"expected one compute share, got a second {item!r} in {text!r}")
            number = _PERCENT_RE.match(item).group(1)
            if "." in number or not 1 <= int(number) <= 100:
                raise GPUSpecError(f"expected a whole percent from 1 to 100, got {item!r} in {text!r}")
            percent = int(number)
        elif item.endswith("%"):
            raise GPUSpecError(f"expected a whole percent from 1 to 100, got {item!r} in {text!r}")
        elif (size := _parse_size(item, text)) is not None:
            if vram is not None:
                raise GPUSpecError(f"expected one memory size, got a second {item!r} in {text!r}")
            vram = size
        elif item.lower() == VGPU:
            if vgpu:
                raise GPUSpecError(f"expected vgpu once, got it twice in {text!r}")
            vgpu = True
        else:
            if models is not None:
                raise GPUSpecError(f"expected models separated by '|', not ',', in {text!r}")
            models = _parse_models(item, text, catalog)
    if count == 0:
        raise GPUSpecError(
            f"expected a count above 0 with a model list or a share; write 0 for no accelerator, in {text!r}"
        )
    if count < 1 and (vram is not None or percent is not None):
        raise GPUSpecError(f"expected either a fraction or a memory/compute share, not both, in {text!r}")
    shared = vgpu or count < 1 or vram is not None or percent is not None
    return _build(count, models or (), shared, vram, percent, text, catalog)


def _parse_models(item: str, text: str, catalog: Catalog | None) -> tuple[str, ...]:
    names: list[str] = []
    for raw in item.split("|"):
        token = raw.strip()
        if not token:
            raise GPUSpecError(f"expected a model name on each side of '|' in {text!r}")
        if token.lower() == VGPU:
            raise GPUSpecError(f"expected vgpu after a comma, such as 1(T4,vgpu), not in a '|' list, in {text!r}")
        if re.fullmatch(_NUMBER, token, re.ASCII):
            raise GPUSpecError(f"expected a size with a unit such as {token}G, got {token!r} in {text!r}")
        if not _MODEL_RE.match(token):
            raise GPUSpecError(f"expected a model name such as A100, got {token!r} in {text!r}")
        if catalog is None:
            names.append(token)
            continue
        resolved = catalog.resolve_all(token)
        if not resolved:
            _unknown_unit(token, text, catalog)
            known = ", ".join(catalog.suggestions(token)) or "none (the catalog is empty)"
            raise UnknownGPUModel(f"unknown GPU model {token!r} in {text!r}; known models include {known}", token, text)
        names.extend(resolved)
    return tuple(names)


def _card_of(token: str, catalog: Catalog) -> str | None:
    """The card model a token names, when it names exactly one card (not a unit of one)."""
    cards = [n for n in catalog.resolve_all(token) if not catalog.entry(n).partition]
    return cards[0] if len(cards) == 1 else None


def _unknown_unit(token: str, text: str, catalog: Catalog) -> None:
    """Raise a message naming what a card offers when ``token`` asks for a MIG profile or a time-sliced replica
    the catalog does not have; return when the token does not look like one."""
    if match := _MIG_TOKEN_RE.match(token):
        card = _card_of(match.group("card"), catalog)
        if card is not None:
            profiles = sorted(e.name[len(card) + 1 :] for e in catalog.units_of(card, MIG))
            offered = f"its profiles: {', '.join(profiles)}"
            if not profiles:
                offered = f"{card} has no MIG profiles in the catalog"
            raise GPUSpecError(f"unknown MIG profile {match.group('profile')!r} of {card} in {text!r}; {offered}")
    if match := _TS_TOKEN_RE.match(token):
        card = _card_of(match.group("card"), catalog)
        if card is not None:
            declared = sorted(e.name for e in catalog.units_of(card, TIME_SLICE))
            if declared:
                hint = f"ask for 1({card}-ts) (declared: {', '.join(declared)})"
            else:
                hint = f"no {card} card is declared time-sliced (an admin declares it per card)"
            raise GPUSpecError(f"unknown time-sliced model {token!r} in {text!r}; {hint}")


def _check_units(count: Decimal, models: tuple[str, ...], shared: bool, text: str, catalog: Catalog) -> None:
    """MIG instances and time-sliced replicas are whole units: no fraction, no share, one replica per instance."""
    for name in models:
        entry = catalog.entry(name)
        if entry.partition and shared:
            kind = "a MIG instance" if entry.partition == MIG else "a time-sliced replica"
            raise GPUSpecError(
                f"expected whole units of {name}: {kind} cannot be split further, such as 1({name}), in {text!r}"
            )
        if entry.partition == TIME_SLICE and count != 1:
            raise GPUSpecError(
                f"expected a count of 1 for a time-sliced replica ({name}): more replicas of one card add no "
                f"compute, in {text!r}"
            )


def _build(
    count: Decimal,
    models: tuple[str, ...],
    shared: bool,
    vram: Decimal | None,
    percent: int | None,
    text: str,
    catalog: Catalog | None,
) -> GPURequest:
    if catalog is not None:
        _check_units(count, models, shared, text, catalog)
    if catalog is not None and shared:
        for name in models:
            if not catalog.shareable(name):
                raise GPUSpecError(
                    f"expected a shareable model for a fraction or a share; {name} is not shareable, in {text!r}"
                )
    if catalog is not None and vram is not None:
        for name in models:
            card = catalog.entry(name).vram_gib
            if vram > card:
                raise GPUSpecError(
                    f"expected at most {_fmt(card)} GiB per card for {name}, got {_fmt(vram)} GiB in {text!r}"
                )
    return GPURequest(count=count, models=models, shared=shared, vram_gib=vram, cores_percent=percent)


def _parse_vendor_neutral(spec: str, catalog: Catalog | None) -> GPURequest:
    values: dict[str, Decimal] = {}
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            raise GPUSpecError(f"expected key=value between commas in {spec!r}")
        key, eq, value = (p.strip() for p in part.partition("="))
        if not eq or not key or not value:
            raise GPUSpecError(f"expected key=value, got {part!r} in {spec!r}")
        key = key.lower().replace("_", "-")
        if key not in _KEYS:
            raise GPUSpecError(f"unknown key {key!r} in {spec!r}; expected vram, tflops-fp16 or tflops-fp32")
        if key in values:
            raise GPUSpecError(f"duplicate key {key!r} in {spec!r}")
        if key == "vram":
            size = _parse_size(value, spec)
            if size is None:
                raise GPUSpecError(f"expected a size such as 16Gi for vram, got {value!r} in {spec!r}")
            values[key] = size
        else:
            if not _COUNT_RE.match(value):
                raise GPUSpecError(f"expected a number such as 100 for {key}, got {value!r} in {spec!r}")
            number = _decimal_literal(value, key, spec)
            if number <= 0:
                raise GPUSpecError(f"expected {key} above 0, got {value!r} in {spec!r}")
            values[key] = number
    req = GPURequest(
        count=Decimal(1),
        min_vram_gib=values.get("vram"),
        min_tflops_fp16=values.get("tflops-fp16"),
        min_tflops_fp32=values.get("tflops-fp32"),
    )
    if catalog is not None and len(catalog) and not candidate_models(req, catalog):
        raise GPUSpecError(f"expected totals that some catalog model meets with at most {MAX_COUNT} cards, in {spec!r}")
    return req


# --- formatting ------------------------------------------------------------------------------


def _fmt_size(gib: Decimal, giga: str) -> str:
    if -gib.normalize().as_tuple().exponent <= MAX_DECIMALS:
        return f"{_fmt(gib)}{giga}"
    return f"{_fmt(gib * 1024)}Mi"


def format_gpu_spec(req: GPURequest) -> str:
    """The canonical text of a request: `parse_gpu_spec(format_gpu_spec(r))` gives r back."""
    if req.is_vendor_neutral:
        parts = []
        if req.min_vram_gib is not None:
            parts.append(f"vram={_fmt_size(req.min_vram_gib, 'Gi')}")
        if req.min_tflops_fp16 is not None:
            parts.append(f"tflops-fp16={_fmt(req.min_tflops_fp16)}")
        if req.min_tflops_fp32 is not None:
            parts.append(f"tflops-fp32={_fmt(req.min_tflops_fp32)}")
        return ",".join(parts)
    if req.is_none:
        return "0"
    items = []
    if req.models:
        items.append("|".join(req.models))
    has_share = req.vram_gib is not None or req.cores_percent is not None
    if req.shared and not has_share and not (req.is_fractional and req.models):
        items.append(VGPU)
    if req.vram_gib is not None:
        items.append(_fmt_size(req.vram_gib, "G"))
    if req.cores_percent is not None:
        items.append(f"{req.cores_percent}%")
    count = _fmt(req.count)
    return f"{count}({','.join(items)})" if items else count


# --- GPU-equivalents and candidates ----------------------------------------------------------

WHOLE = 1000  # a card, in the thousandths that shares are placed in


@dataclass(frozen=True)
class CardOption:
    """One way to satisfy a request per instance: ``cards`` whole cards, or ``milli`` thousandths of one card,
    of ``model``, worth ``equivalents`` GPU-equivalents (share x exchange rate)."""

    model: str
    cards: int
    milli: int
    equivalents: Decimal

    @property
    def count(self) -> Decimal:
        """Cards per instance, a fraction below 1 for a share."""
        return Decimal(self.cards) if self.cards else Decimal(self.milli) / WHOLE


def _figure(value: object) -> Decimal:
    """A catalog figure as a Decimal; None, 0 and negatives all mean "not published"."""
    if value is None:
        return Decimal(0)
    number = value if isinstance(value, Decimal) else Decimal(str(value))
    return max(number, Decimal(0))


def card_options(req, models: Iterable[object]) -> list[CardOption]:
    """Which of ``models`` satisfy the request, with how many cards (or what share of one) and how many
    GPU-equivalents, cheapest first: the one answer the submit checks, the demand figures and the engine use.

    ``req`` is a :class:`GPURequest` or any object with its fields; ``models`` are catalog entries or any
    objects with ``name``, ``vram_gib``, ``tflops_fp16``, ``tflops_fp32``, ``exchange_rate`` and ``shareable``,
    already narrowed to the models the request names. Shares are rounded up to whole thousandths of a card,
    as they are placed.
    """
    count = _figure(getattr(req, "count", 0))
    totals = [
        getattr(req, "min_vram_gib", None),
        getattr(req, "min_tflops_fp16", None),
        getattr(req, "min_tflops_fp32", None),
    ]
    vram, cores = getattr(req, "vram_gib", None), getattr(req, "cores_percent", None)
    shared = bool(getattr(req, "shared", False))
    options = []
    for m in models:
        rate = _figure(m.exchange_rate)
        if any(t is not None for t in totals):
            figures = (_figure(m.vram_gib), _figure(m.tflops_fp16), _figure(m.tflops_fp32))
            needs = [(_figure(t), have) for t, have in zip(totals, figures, strict=True) if t is not None]
            if any(have <= 0 for _need, have in needs):
                continue  # a model without the figure asked for cannot qualify
            cards = max(1, *(int((need / have).to_integral_value(rounding=ROUND_CEILING)) for need, have in needs))
            if cards <= MAX_COUNT:
                options.append(CardOption(m.name, cards, 0, cards * rate))
        elif vram is not None or cores is not None:
            if not m.shareable:
                continue
            milli = 0
            if vram is not None:
                size = _figure(m.vram_gib)
                if size <= 0 or _figure(vram) > size:
                    continue
                milli = int((_figure(vram) / size * WHOLE).to_integral_value(rounding=ROUND_CEILING))
            if cores is not None:
                milli = max(milli, int(_figure(cores) * 10))
            milli = max(1, milli)
            if milli >= WHOLE:
                options.append(CardOption(m.name, 1, 0, rate))
            else:
                options.append(CardOption(m.name, 0, milli, Decimal(milli) / WHOLE * rate))
        elif 0 < count < 1:
            if m.shareable:
                milli = max(1, int((count * WHOLE).to_integral_value()))
                options.append(CardOption(m.name, 0, milli, Decimal(milli) / WHOLE * rate))
        elif count >= 1 and (not shared or m.shareable):
            cards = int(count)
            options.append(CardOption(m.name, cards, 0, cards * rate))
    return sorted(options, key=lambda o: (o.equivalents, o.model))


def _named_models(req: GPURequest, catalog: Catalog) -> list[CatalogEntry]:
    # Resolving again lets a request parsed without a catalog ("v100") match its models.
    if not req.models:
        # "Any model" means any card: MIG instances and time-sliced replicas are used only when named.
        return [entry for entry in catalog if not entry.partition]
    names = {n for m in req.models for n in catalog.resolve_all(m)}
    return [entry for entry in catalog if entry.name in names]


def candidate_models(req: GPURequest, catalog: Catalog) -> list[tuple[str, Decimal]]:
    """(model, cards per instance) pairs of the catalog that satisfy the request, cheapest in equivalents first.

    For a vendor-neutral request the count is the smallest that meets every total; models without a
    published figure the request asks for are left out.
    """
    if req.is_none:
        return []
    return [(o.model, o.count) for o in card_options(req, _named_models(req, catalog))]


def equivalents(req: GPURequest, catalog: Catalog, model: str | None = None) -> Decimal:
    """GPU-equivalents of the request when it lands on `model` (count x exchange rate).

    A `1(16G,50%)` request counts the larger of its core and VRAM share of the card.
    Without a model: the cheapest model the request can land on. Raises
    GPUSpecError when the request cannot land on `model` (or on any model).
    """
    if req.is_none:
        return Decimal(0)
    options = card_options(req, _named_models(req, catalog))
    if model is None:
        if not options:
            raise GPUSpecError(f"no model in the catalog satisfies {format_gpu_spec(req)!r}")
        return options[0].equivalents
    entry = catalog.entry(model)
    for option in options:
        if option.model == entry.name:
            return option.equivalents
    raise GPUSpecError(f"{entry.name} cannot satisfy {format_gpu_spec(req)!r}")
