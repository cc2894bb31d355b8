"""NVIDIA mig-parted's configuration format (``version: v1``, ``mig-configs:``), read and written. Pure: the YAML is
parsed by the caller; this module takes and gives plain data.

A mig-parted file names configurations (``all-balanced``, ``all-1g.10gb``, ...); each is a list of entries::

    - device-filter: ["0x233510DE"]   # optional: PCI device IDs (device << 16 | vendor) the entry is for
      devices: all                    # or a list of GPU indices
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}

The rules are mig-parted's own (its ``api/spec/v1`` package and ``apply``): ``version`` must be ``v1``; an entry
needs ``devices`` and ``mig-enabled``; ``devices`` is ``all`` or a list of integers; ``mig-devices`` is required
when MIG is enabled and must be empty when it is not; a device filter is one string or a list of them, and an
entry applies to a GPU when the filter (if any) names its PCI device ID and ``devices`` includes its index.
``apply`` walks the entries in order and applies each to every GPU it matches, so where several match a GPU the
last one stands. A GPU is at its configuration when the multiset of MIG devices is the same, placements aside.

mig-parted lets the driver choose placements; flexmig works in placements, so a baseline's profile counts are
turned into a layout by :func:`layout_for`, preferring the instances a GPU already has.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from flexmig.errors import ConfigError
from flexmig.mig.catalogue import A100_40, A100_80, H100_80, H200, GpuModel, Profile
from flexmig.mig.layout import Layout

__all__ = [
    "PCI_DEVICE_IDS",
    "GpuBaseline",
    "GpuState",
    "MigPartedEntry",
    "MigPartedSpec",
    "baseline_for",
    "export_spec",
    "layout_for",
    "mig_device_problem",
    "parse_profile",
    "parse_spec",
    "to_yaml",
]

VERSION = "v1"

#: PCI device IDs (device << 16 | vendor 0x10DE) of the models flexmig knows, as mig-parted's device filters
#: write them. The SXM boards only: the same chip on a PCIe board has another ID.
PCI_DEVICE_IDS: Mapping[str, int] = {
    A100_40.key: 0x20B010DE,
    A100_80.key: 0x20B210DE,
    H100_80.key: 0x233010DE,
    H200.key: 0x233510DE,
}

_PROFILE = re.compile(r"^(?:(\d+)c\.)?(\d+)g\.(\d+)gb(?:([+-])([a-z0-9.,]+))?$")
_DEVICE_ID = re.compile(r"^(0[xX][0-9a-fA-F]{1,8}|\d+)(?::(0[xX][0-9a-fA-F]{1,8}|\d+))?$")


@dataclass(frozen=True, slots=True)
class MigPartedEntry:
    """One entry of a named configuration: which GPUs it is for, and what they get."""

    devices: tuple[int, ...] | None
    """GPU indices; None for ``all``."""
    mig_enabled: bool
    mig_devices: Mapping[str, int]
    device_filter: tuple[str, ...] = ()

    def matches(self, index: int, model: GpuModel | None) -> bool:
        """True when this entry applies to GPU ``index`` of ``model`` (None: a model flexmig does not know,
        which only an entry without a device filter matches). A filter that also names a subsystem ID
        (``0x233510DE:0x...``) matches no GPU here: flexmig does not read subsystem IDs, and mig-parted matches
        those exactly."""
        if self.devices is not None and index not in self.devices:
            return False
        if not self.device_filter:
            return True
        known = PCI_DEVICE_IDS.get(model.key) if model is not None else None
        return known is not None and any(_filter_id(f) == (known, None) for f in self.device_filter)


@dataclass(frozen=True, slots=True)
class MigPartedSpec:
    """A parsed mig-parted file: its named configurations, in file order."""

    configs: Mapping[str, tuple[MigPartedEntry, ...]]
    source: str = "<mig-parted config>"

    def select(self, name: str | None) -> tuple[MigPartedEntry, ...]:
        """The entries of configuration ``name``; with no name, the only one (as ``mig-parted -c`` defaults)."""
        if not name:
            if len(self.configs) != 1:
                raise ConfigError(
                    f"{self.source}: holds {len(self.configs)} configurations; name one of them "
                    f"({_some(self.configs)})"
                )
            return next(iter(self.configs.values()))
        if name not in self.configs:
            raise ConfigError(f"{self.source}: no configuration named {name!r}; it has {_some(self.configs)}")
        return self.configs[name]


@dataclass(frozen=True, slots=True)
class GpuBaseline:
    """What a configuration asks of one GPU: MIG on or off, and how many MIG devices of each profile."""

    mig_enabled: bool
    counts: Mapping[str, int]

    def describe(self) -> str:
        """``2 x 1g.18gb + 1 x 3g.71gb``, or ``MIG disabled`` / ``MIG enabled, no instances``."""
        if not self.mig_enabled:
            return "MIG disabled"
        items = [f"{n} x {p}" for p, n in sorted(self.counts.items()) if n]
        return " + ".join(items) if items else "MIG enabled, no instances"


def _some(configs: Mapping[str, object], limit: int = 8) -> str:
    names = sorted(configs)
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _filter_id(text: str) -> tuple[int, int | None] | None:
    """A device filter as (device ID, subsystem ID or None); None when it is no device ID."""
    m = _DEVICE_ID.match(text.strip())
    if m is None:
        return None
    primary = int(m.group(1), 0)
    return primary, (int(m.group(2), 0) if m.group(2) else None)


# ------------------------------------------------------------------------------------------------ reading


def parse_spec(data: object, source: str = "<mig-parted config>") -> MigPartedSpec:
    """A mig-parted file's parsed YAML, checked by mig-parted's rules; ConfigError names the file and the
    configuration (and entry) of the first fault, as ``mig-parted assert --valid-config`` would refuse it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: not a mig-parted configuration (expected a mapping with version and mig-configs)")
    if "version" not in data:
        raise ConfigError(f"{source}: unable to parse with missing 'version' field")
    if data["version"] != VERSION:
        raise ConfigError(f"{source}: unknown version: {data['version']!r} (flexmig reads version {VERSION})")
    extra = sorted(str(k) for k in data if k not in ("version", "mig-configs"))
    if extra:
        raise ConfigError(f"{source}: unexpected field: {extra[0]}")
    configs = data.get("mig-configs")
    if not isinstance(configs, dict) or not configs:
        raise ConfigError(f"{source}: at least one entry in 'mig-configs' is required")
    out: dict[str, tuple[MigPartedEntry, ...]] = {}
    for name, entries in configs.items():
        where = f"{source}: mig-configs.{name}"
        if not isinstance(entries, list) or not entries:
            raise ConfigError(f"{where}: at least one entry is required")
        out[str(name)] = tuple(_entry(e, f"{where}[{i}]") for i, e in enumerate(entries))
    return MigPartedSpec(out, source)


def _entry(raw: object, where: str) -> MigPartedEntry:
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: an entry is a mapping with devices, mig-enabled and mig-devices")
    for required in ("devices", "mig-enabled"):
        if required not in raw:
            raise ConfigError(f"{where}: missing required field: {required}")
    extra = sorted(str(k) for k in raw if k not in ("device-filter", "devices", "mig-enabled", "mig-devices"))
    if extra:
        raise ConfigError(f"{where}: unexpected field: {extra[0]}")
    devices_raw = raw["devices"]
    devices: tuple[int, ...] | None
    if isinstance(devices_raw, str):
        if devices_raw != "all":
            raise ConfigError(f"{where}: invalid string input for 'devices': {devices_raw!r} (all, or GPU indices)")
        devices = None
    elif isinstance(devices_raw, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in devices_raw):
        devices = tuple(devices_raw)
    else:
        raise ConfigError(f"{where}: devices must be all or a list of GPU indices")
    enabled = raw["mig-enabled"]
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: mig-enabled must be true or false")
    mig_devices = raw.get("mig-devices")
    if enabled and mig_devices is None:
        raise ConfigError(f"{where}: missing required field 'mig-devices' when 'mig-enabled' is true")
    counts: dict[str, int] = {}
    if mig_devices is not None:
        if not isinstance(mig_devices, dict):
            raise ConfigError(f"{where}: mig-devices must map profile names to counts")
        for profile, count in mig_devices.items():
            problem = mig_device_problem(profile)
            if problem is not None:
                raise ConfigError(f"{where}: mig-devices: {problem}")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ConfigError(f"{where}: mig-devices: invalid count for {profile!r}: {count!r}")
            counts[profile] = count
        if counts and not any(counts.values()):
            raise ConfigError(f"{where}: mig-devices: all counts for all MIG profiles are 0")
    if not enabled and any(counts.values()):
        raise ConfigError(f"{where}: MIG devices included when 'mig-enabled' is false")
    filters_raw = raw.get("device-filter")
    filters: tuple[str, ...] = ()
    if isinstance(filters_raw, str):
        filters = (filters_raw,) if filters_raw else ()
    elif isinstance(filters_raw, list) and all(isinstance(f, str) for f in filters_raw):
        filters = tuple(filters_raw)
    elif filters_raw is not None:
        raise ConfigError(f"{where}: device-filter must be a PCI device ID or a list of them")
    for f in filters:
        if _filter_id(f) is None:
            raise ConfigError(f"{where}: device-filter {f!r} is not a PCI device ID such as 0x233510DE")
    return MigPartedEntry(devices, enabled, counts, filters)


def mig_device_problem(name: object) -> str | None:
    """Why flexmig refuses ``name`` as a MIG device of a mig-parted configuration, or None: the one rule that
    ``flexmig config check`` (through :func:`parse_spec`) and ``flexmig standdown`` (through :func:`parse_profile`)
    both apply. mig-parted's format is ``[Cc.]Gg.Mgb[+attrs]``; flexmig also refuses a compute-instance profile smaller
    than its GPU instance (``1c.2g.35gb``), since it makes one compute instance spanning each GPU instance."""
    m = _PROFILE.match(name) if isinstance(name, str) else None
    if m is None:
        return f"invalid format for {name!r} (e.g. 1g.10gb, 1g.10gb+me)"
    c, g = m.group(1), m.group(2)
    if c is not None and int(c) != int(g):
        return (
            f"{name}: a {c}-slice compute instance inside a {g}g GPU instance; flexmig makes one compute instance "
            "spanning each GPU instance"
        )
    return None


def parse_profile(name: str, model: GpuModel) -> Profile:
    """The profile of ``model`` a mig-parted MIG-device name stands for (``1g.18gb``, ``1g.18gb+me``,
    ``7c.7g.141gb``); ConfigError for a name :func:`mig_device_problem` refuses or a name the model lacks."""
    problem = mig_device_problem(name)
    if problem is not None:
        raise ConfigError(problem)
    m = _PROFILE.match(name)
    assert m is not None
    _, g, gb, sign, attrs = m.groups()
    plain = f"{g}g.{gb}gb" + (f"{sign}{attrs}" if sign else "")
    try:
        return model.profile(plain)
    except KeyError as exc:
        raise ConfigError(str(exc.args[0])) from None


def baseline_for(entries: Sequence[MigPartedEntry], index: int, model: GpuModel | None) -> GpuBaseline | None:
    """What ``entries`` (one configuration) ask of GPU ``index``: the last entry that matches it, as mig-parted's
    ``apply`` leaves it; None when no entry does."""
    chosen = None
    for entry in entries:
        if entry.matches(index, model):
            chosen = entry
    if chosen is None:
        return None
    counts = {p: n for p, n in chosen.mig_devices.items() if n} if chosen.mig_enabled else {}
    return GpuBaseline(chosen.mig_enabled, counts)


def layout_for(model: GpuModel, counts: Mapping[str, int], prefer: Layout | None = None) -> Layout:
    """A layout of ``model`` holding exactly ``counts`` (profile name -> instances), the one that keeps the most
    instances of ``prefer`` where they are (then the lowest starts); ConfigError when the hardware has none."""
    wanted: list[Profile] = []
    for name, n in counts.items():
        wanted += [parse_profile(name, model)] * n
    wanted.sort(key=lambda p: (-p.memory_slices, -p.compute_slices, p.name))
    keep = {(i.profile, i.start) for i in prefer} if prefer is not None else set()
    best: tuple[int, tuple[tuple[int, str], ...], Layout] | None = None

    def search(layout: Layout, rest: list[Profile], min_start: int) -> None:
        nonlocal best
        if not rest:
            kept = sum(1 for i in layout if (i.profile, i.start) in keep)
            key = (-kept, tuple((i.start, i.profile.name) for i in layout))
            if best is None or key < (best[0], best[1]):
                best = (key[0], key[1], layout)
            return
        head, tail = rest[0], rest[1:]
        for start in layout.placements(head):
            if start < min_start:
                continue  # equal profiles in rising order: each set of placements once
            nxt = start if tail and tail[0] == head else 0
            search(layout.place(head, start), tail, nxt)

    search(Layout.empty(model), wanted, 0)
    if best is None:
        shown = " + ".join(f"{n} x {p}" for p, n in counts.items() if n)
        raise ConfigError(f"no layout of {model.key} holds {shown or 'nothing'}: MIG placement rules forbid it")
    return best[2]


# ------------------------------------------------------------------------------------------------ writing


@dataclass(frozen=True, slots=True)
class GpuState:
    """One GPU as an export sees it: index, model (None when flexmig has no table for it), MIG mode and the
    mig-parted names of its MIG devices (one per compute instance)."""

    index: int
    model: GpuModel | None
    mig_enabled: bool
    mig_devices: tuple[str, ...] = ()


@dataclass(slots=True)
class _Group:
    """GPUs that share MIG settings, while an export merges them."""

    enabled: bool
    counts: tuple[tuple[str, int], ...]
    devices: set[int]
    filters: set[str | None]


def export_spec(gpus: Iterable[GpuState], name: str = "current") -> dict[str, object]:
    """The node's layout as a mig-parted configuration called ``name``, compacted the way ``mig-parted export``
    does: GPUs with the same MIG settings share an entry, a device filter only where the node mixes models,
    and ``devices: all`` where an entry covers every GPU its filter names."""
    groups: list[_Group] = []
    by_filter: dict[str | None, set[int]] = {}
    for g in sorted(gpus, key=lambda g: g.index):
        pci = PCI_DEVICE_IDS.get(g.model.key) if g.model is not None else None
        flt = f"0x{pci:08X}" if pci is not None else None
        by_filter.setdefault(flt, set()).add(g.index)
        counts = tuple(sorted(Counter(g.mig_devices).items())) if g.mig_enabled else ()
        group = next((x for x in groups if (x.enabled, x.counts) == (g.mig_enabled, counts)), None)
        if group is None:
            groups.append(_Group(g.mig_enabled, counts, {g.index}, {flt}))
        else:
            group.devices.add(g.index)
            group.filters.add(flt)
    entries: list[dict[str, object]] = []
    for group in groups:
        covered = set().union(*(by_filter[f] for f in group.filters))
        item: dict[str, object] = {}
        named = sorted(f for f in group.filters if f is not None)
        # A filter only where the node mixes models and GPUs differ; a GPU of a model without a known PCI ID
        # cannot be named by one, so its entry lists its index instead.
        keep_filter = len(by_filter) > 1 and len(groups) > 1 and None not in group.filters
        if keep_filter:
            item["device-filter"] = named[0] if len(named) == 1 else named
        every = len(groups) == 1 or (keep_filter and group.devices == covered)
        item["devices"] = "all" if every else sorted(group.devices)
        item["mig-enabled"] = group.enabled
        item["mig-devices"] = dict(group.counts)
        entries.append(item)
    return {"version": VERSION, "mig-configs": {name: entries}}


def to_yaml(spec: Mapping[str, object], header: Sequence[str] = ()) -> str:
    """A configuration from :func:`export_spec` as YAML in mig-parted's own style (profile names quoted, device
    lists in flow style), with ``header`` lines as comments on top."""
    lines = [f"# {h}" for h in header]
    lines.append(f"version: {spec['version']}")
    lines.append("mig-configs:")
    configs = spec["mig-configs"]
    assert isinstance(configs, Mapping)
    for name, entries in configs.items():
        lines.append(f"  {_yaml_key(str(name))}:")
        for entry in entries:
            first = True
            for key in ("device-filter", "devices", "mig-enabled", "mig-devices"):
                if key not in entry:
                    continue
                lead = "    - " if first else "      "
                first = False
                value = entry[key]
                if key == "mig-devices":
                    if not value:
                        lines.append(f"{lead}mig-devices: {{}}")
                        continue
                    lines.append(f"{lead}mig-devices:")
                    lines += [f'        "{p}": {n}' for p, n in value.items()]
                elif isinstance(value, bool):
                    lines.append(f"{lead}{key}: {'true' if value else 'false'}")
                elif isinstance(value, list):
                    items = ", ".join(f'"{v}"' if isinstance(v, str) else str(v) for v in value)
                    lines.append(f"{lead}{key}: [{items}]")
                else:
                    shown = f'"{value}"' if key == "device-filter" else str(value)
                    lines.append(f"{lead}{key}: {shown}")
    return "\n".join(lines) + "\n"


def _yaml_key(name: str) -> str:
    """A configuration name as a YAML key: bare when it is plain (``all-balanced``, ``all-1g.10gb``), else quoted."""
    return name if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) else '"' + name.replace('"', '\\"') + '"'
