"""Turn the admin query results (plain dicts, see docs/contracts.md "Admin API") into what
the templates show: plots, highlighted source, grouped measurements. No data access here.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from service.dashboard import plots
from service.dashboard.highlight import highlight_python
from service.tenants import ALL_TENANTS

STATUSES = ("pending", "heuristic", "tuned", "failed", "invalidated")
SORTS = {"last_used": "last use", "speedup": "speedup", "tuning_s": "tuning time",
         "hits": "hits", "created": "created"}
MISS_REASONS = {"unknown_graph": "unknown graph", "other_gpu": "other GPU",
                "other_versions": "other triton/torch", "other_compiler": "other compiler version"}


def worker_state(worker: Mapping[str, Any], live_within_s: float) -> str:
    """`live` (running, recent heartbeat), `stopped` (said goodbye) or `dead` (silent: the
    process died, or never got past start-up)."""
    if worker.get("status") != "running":
        return "stopped"
    return "live" if (worker.get("heartbeat_age_s") or 0) <= live_within_s else "dead"


def overview_context(stats: Mapping[str, Any], live_within_s: float = 15.0) -> dict[str, Any]:
    """Plots and tables for the overview page from `store.admin.stats`; a worker counts
    as live while its heartbeat is younger than `live_within_s` (the rule of the
    `kiln_workers_alive` metric)."""
    by_status = dict(stats.get("entries_by_status") or {})
    workers = [{**w, "state": worker_state(w, live_within_s)}
               for w in stats.get("workers") or []]
    misses = stats.get("misses_by_reason") or {}
    hits, missed = int(stats.get("hits") or 0), int(stats.get("misses") or 0)
    return {
        "stats": stats,
        "total_entries": sum(by_status.values()),
        "hits": hits,
        "misses": missed,
        "hit_rate": (100.0 * hits / (hits + missed)) if hits + missed else None,
        "status_plot": plots.counts_plot(by_status, "Entries by status", "status", "entries"),
        "hit_rate_plot": plots.hit_rate_plot(stats.get("hit_rate_series") or []),
        "misses_plot": plots.counts_plot(
            {MISS_REASONS.get(k, k): v for k, v in misses.items()}, "Misses by reason",
            "misses", "misses"),
        "speedup_plot": plots.speedup_plot(stats.get("speedups") or []),
        "queue_depth": dict(stats.get("queue_depth") or {}),
        "workers": workers,
        "live_workers": sum(w["state"] == "live" for w in workers),
    }


def entry_context(entry: Mapping[str, Any],
                  siblings: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """Kernels with highlighted source and a candidate plot each, from `entry_detail`;
    `siblings` (list items of the same graph) become "same graph, other targets" rows."""
    measured: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in entry.get("measurements") or []:
        measured[row.get("kernel") or "?"].append(row)
    kernels = []
    for index, kernel in enumerate(entry.get("kernels") or []):
        name = kernel.get("name") or f"kernel_{index}"
        rows = sorted(measured.pop(name, []), key=_measurement_order)
        kernels.append({
            **kernel,
            "anchor": f"k{index}",
            "source_html": highlight_python(kernel.get("source") or "# source not stored"),
            "config_text": plots.config_label(kernel.get("config"), kernel.get("variant")),
            "measurements": [{**r, "config_text": plots.config_label(r.get("config"),
                                                                       r.get("variant"))}
                             for r in rows],
            # No chart for a kernel nothing was measured for (a heuristic-only entry).
            "plot": plots.candidate_plot(name, rows, _chosen(kernel, rows), f"cand{index}",
                                         chosen_variant=kernel.get("variant")) if rows else None,
        })
    # Measurements for kernels the schedule no longer names (e.g. after a compiler change).
    orphans = [r for rows in measured.values() for r in rows]
    target = entry.get("target") or {}
    return {
        "entry": entry,
        "title": entry_title(entry),
        "target": target,
        # Interpreter times on a CPU target check correctness; a speedup from them misleads.
        "timed": target.get("device_type") != "cpu",
        "kernels": kernels,
        "summary": kernel_summary(kernels),
        "orphan_measurements": orphans,
        "op_summary": sorted((entry.get("op_summary") or {}).items(),
                             key=lambda kv: (-kv[1], kv[0])),
        "timings_plot": plots.timings_plot(entry.get("eager_ms"), entry.get("heuristic_ms"),
                                           entry.get("tuned_ms")),
        "jobs": list(entry.get("jobs") or []),
        "siblings": [{**other, "differs": target_differences(entry.get("target") or {},
                                                             other.get("target") or {})}
                     for other in siblings if other.get("key") != entry.get("key")],
    }


def entry_title(entry: Mapping[str, Any]) -> str:
    """A readable name for an entry: its model tag, else its most frequent aten ops."""
    if entry.get("tag"):
        return str(entry["tag"])
    ops = sorted((entry.get("op_summary") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    names = [op.split(".")[1] if op.count(".") >= 2 else op for op, _ in ops[:3]]
    more = ", …" if len(ops) > 3 else ""
    return f"graph of {', '.join(names)}{more}" if names else "graph (no ops recorded)"


def kernel_summary(kernels: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per kernel: its best known time (tuned, else heuristic) and that time's
    share of the kernels' total, slowest first, so the kernels worth a look lead."""
    best = [k.get("tuned_ms") if k.get("tuned_ms") is not None else k.get("heuristic_ms")
            for k in kernels]
    total = sum(ms for ms in best if ms)
    rows = [{"anchor": k["anchor"], "name": k.get("name"), "kind": k.get("kind"),
             "variant": k.get("variant"), "config_text": k["config_text"],
             "heuristic_ms": k.get("heuristic_ms"), "tuned_ms": k.get("tuned_ms"),
             "candidates": len(k["measurements"]),
             "share": (ms / total) if ms and total else None}
            for k, ms in zip(kernels, best, strict=True)]
    return sorted(rows, key=lambda r: -(r["share"] or 0.0))


def plans_by_tenant(items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Plans (as `store.list_plans` gives them) grouped by tenant, the published ones (tenant
    `*`) first, then tenants by name; each tenant's plan says whether it is the published one
    for its key (`this`), another tenant's is (`other`), or none is (None)."""
    published = {p["key"]: p.get("published_from") for p in items if p["tenant"] == ALL_TENANTS}
    groups: dict[str, list[dict[str, Any]]] = {}
    for plan in items:
        state = None
        if plan["tenant"] != ALL_TENANTS and plan["key"] in published:
            state = "this" if published[plan["key"]] == plan["tenant"] else "other"
        groups.setdefault(plan["tenant"], []).append({**plan, "published_state": state})
    order = sorted(groups, key=lambda t: (t != ALL_TENANTS, t))
    return [{"tenant": t, "published": t == ALL_TENANTS, "plans": groups[t]} for t in order]


def job_duration(job: Mapping[str, Any]) -> float | None:
    """Seconds a finished job took from its first start to its end (None while it runs)."""
    if not job.get("finished_at"):
        return None
    started = next((h.get("at") for h in job.get("history") or [] if h.get("status") == "running"),
                   job.get("created_at"))
    if not started:
        return None
    return max(0.0, (_as_datetime(job["finished_at"]) - _as_datetime(started)).total_seconds())


def _as_datetime(value: Any) -> datetime:
    when = value if isinstance(value, datetime) else datetime.fromisoformat(
        str(value).replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=UTC)


TARGET_FIELDS = ("device_type", "arch", "name", "torch", "triton", "compiler")


def target_differences(mine: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """`name: NVIDIA H200` for each key component where `other` differs from `mine`."""
    return [f"{field}: {other.get(field)}" for field in TARGET_FIELDS
            if mine.get(field) != other.get(field)]


def _measurement_order(row: Mapping[str, Any]) -> tuple[Any, ...]:
    # Stable order, by variant then config values (numerically), so candidate numbers in the
    # plot and the table agree and do not depend on measurement order.
    config = row.get("config") or {}
    values = tuple((k, v if isinstance(v, int | float) else math.inf, str(v))
                   for k, v in sorted(config.items()))
    return (str(row.get("variant") or ""), values)


def _chosen(kernel: Mapping[str, Any], rows: list[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The schedule's config for this kernel, when one of the candidates matches it."""
    config = kernel.get("config")
    if config is None:
        return None
    wanted = plots.config_label(config)
    same_variant = [r for r in rows if r.get("variant") in (None, kernel.get("variant"))]
    return config if any(plots.config_label(r.get("config")) == wanted
                         for r in same_variant) else None


def age(value: Any) -> str:
    """`3 min ago`-style text for a datetime or ISO string (empty for None)."""
    if value in (None, ""):
        return ""
    when = _as_datetime(value)
    return seconds(max((datetime.now(UTC) - when).total_seconds(), 0.0)) + " ago"


def seconds(value: float | None) -> str:
    """Human text for a duration in seconds: `42 s`, `3 min`, `2.5 h`."""
    if value is None:
        return "–"
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.0f} min"
    return f"{value / 3600:.1f} h"


def ms(value: float | None) -> str:
    """Milliseconds with three significant digits, or a dash."""
    return "–" if value is None else f"{value:.3g} ms"


def speedup(value: float | None) -> str:
    """`1.42x` or a dash."""
    return "–" if value is None else f"{value:.3g}x"
