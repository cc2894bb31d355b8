"""PromQL building blocks shared by the dashboards and the rules, and the two tools tests need on expressions.

Selectors use the dashboard variables ``$Hostname``, ``$gpu``, ``$GPU_I_ID`` and ``$mig_uuid`` on flexmig's identity
labels
(the same names dcgm-exporter uses, see ``daemon/flexmig/metrics/collector.py``). DCGM overlays join
dcgm-exporter's rows onto our instances on ``Hostname`` + ``gpu`` + ``GPU_I_ID``; dcgm-exporter 4.8.3 renamed
its host label to ``hostname``, so the host label is copied over first and both spellings work.

:func:`metric_names` lists the metric names an expression reads (so tests can check each against the
catalogue) and :func:`substitute` replaces Grafana variables with concrete values (so promtool and Prometheus
can run a panel's query).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

__all__ = [
    "COMPUTE_SIZES",
    "GI",
    "GPU",
    "HOST",
    "INST",
    "SLICES",
    "compute_slices",
    "dcgm_overlay",
    "metric_names",
    "or_zero",
    "slice_occupant",
    "substitute",
]

HOST = 'Hostname=~"$Hostname"'
"""Matcher for the host variable."""
GPU = f'{HOST}, gpu=~"$gpu"'
"""Matchers for host and GPU variables."""
GI = f'{GPU}, GPU_I_ID=~"$GPU_I_ID"'
"""Matchers for host, GPU and GPU instance ID variables."""
INST = f'{GI}, mig_uuid=~"$mig_uuid"'
"""Matchers for host, GPU, GPU instance ID and MIG device UUID variables: the UUID tells apart the instances whose
GPU instance IDs repeat on every GPU and every node."""
SLICES = 8
"""Memory slices of every MIG-capable GPU (A100, H100, H200): the columns of a slice map."""

_INSTANCE_KEY = "Hostname, gpu, GPU_I_ID"


def or_zero(expr: str, by: str = "Hostname", base: str = "flexmig_last_sweep_timestamp_seconds") -> str:
    """``expr``, or 0 for every ``by`` group flexmigd reports where ``expr`` has no series.

    Error counters have no series until the first error; this shows a flat 0 for a healthy daemon rather than
    "No data", and still shows nothing at all when the daemon is not scraped.
    """
    return f"({expr}) or on({by}) (0 * max by ({by}) ({base}{{{HOST}}}))"


def dcgm_overlay(fields: Sequence[str], *, scale: Mapping[str, float] | None = None, match: str = INST) -> str:
    """dcgm-exporter's per-instance series ``fields`` (every naming era), restricted to flexmig's instances.

    ``scale`` multiplies a field into base units (``DCGM_FI_DEV_FB_USED`` is in MiB before 4.9). The join is on
    ``Hostname`` + ``gpu`` + ``GPU_I_ID``: the series of the MIG instances flexmigd reports on the selected host,
    GPU and instance, whichever era of dcgm-exporter is scraped.
    """
    factors = scale or {}
    terms = []
    for field in fields:
        term = f'label_replace({field}{{gpu=~"$gpu", GPU_I_ID=~"$GPU_I_ID"}}, "Hostname", "$1", "hostname", "(.+)")'
        if field in factors:
            term = f"({term} * {factors[field]:g})"
        terms.append(term)
    return f"({' or '.join(terms)}) and on({_INSTANCE_KEY}) flexmig_mig_memory_total_bytes{{{match}}}"


COMPUTE_SIZES = (1, 2, 3, 4, 7)
"""Compute slices a MIG profile can have: the ``Ng`` its name starts with (``3g.71gb``, ``1g.18gb+me``)."""


def compute_slices(match: str = GPU) -> str:
    """Per instance: its compute slices, read from the ``GPU_I_PROFILE`` label of a family every detail from
    ``standard`` on exports (``flexmig_mig_compute_slices`` itself is ``full``: the label says it already)."""
    return " or ".join(
        f'(0 * flexmig_mig_placement_start{{{match}, GPU_I_PROFILE=~"{n}g[.].*"}} + {n})' for n in COMPUTE_SIZES
    )


def slice_occupant(slice_index: int, match: str = GPU) -> str:
    """Per GPU: the compute slices of the instance that holds memory slice ``slice_index``, 0 when it is free.

    One series per (Hostname, gpu), labelled ``slice``: a state timeline of the eight queries draws each GPU's
    layout as a map of its memory slices over time (a change of layout shows as a change of colour).
    """
    s = slice_index
    held = (
        f"max by (Hostname, gpu) (({compute_slices(match)}) "
        f"and on({_INSTANCE_KEY}) (flexmig_mig_placement_start{{{match}}} <= {s}) "
        f"and on({_INSTANCE_KEY}) "
        f"(flexmig_mig_placement_start{{{match}}} + flexmig_mig_memory_slices{{{match}}} > {s}))"
    )
    free = f"(0 * max by (Hostname, gpu) (flexmig_gpu_mig_mode{{{match}}} == 1))"
    return f'label_replace({held} or {free}, "slice", "{s}", "gpu", ".*")'


# ------------------------------------------------------------------------------------------------ analysis

_STRING = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`')
_BRACES = re.compile(r"\{[^{}]*\}")
_BRACKETS = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)")
_KEYWORDS = frozenset(
    {
        "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
        "bool", "offset", "start", "end", "inf", "nan",
    }
)  # fmt: skip


def metric_names(expr: str) -> frozenset[str]:
    """The metric names ``expr`` selects: identifiers that are not functions, keywords or label names.

    Good enough for the expressions written here (tests also parse every one with promtool).
    """
    text = _STRING.sub('""', expr)
    text = _BRACES.sub("{}", text)
    text = _BRACKETS.sub("[]", text)
    text = _GROUPING.sub(" ", text)
    names = set()
    for m in _IDENT.finditer(text):
        word = m.group(1)
        rest = text[m.end() :].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS:
            continue
        names.add(word)
    return frozenset(names)


_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::[a-z]+)?\}|([A-Za-z_][A-Za-z0-9_]*))")


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """``expr`` with every Grafana variable (``$name``, ``${name}``, ``$__rate_interval``...) replaced.

    Raises KeyError naming the variable when ``values`` lacks one, so a test sees which one is undefined.
    """

    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"variable ${name} has no value (in {expr!r})")
        return values[name]

    return _VARIABLE.sub(repl, expr)


def variables_in(expr: str) -> frozenset[str]:
    """Names of the Grafana variables ``expr`` uses."""
    return frozenset(m.group(1) or m.group(2) for m in _VARIABLE.finditer(expr))
