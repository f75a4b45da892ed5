"""The client's commands: `kiln stats` (the service's counters, read through its admin API)
and `kiln cache` (this machine's schedule cache), as sccache's `--show-stats`.

Standard library only, like the rest of the client: both work on a training node that has
no service stack. Errors end the command with one line, as everywhere in the CLI.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from kiln import config as kiln_config
from kiln.cache import PlanCache, ScheduleCache
from kiln.client import ServiceClient, ServiceError

_NUMBER = re.compile(r"^(-?[\d.]+(%|s)?|-|)$")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_MISS_REASONS = {"unknown_graph": "graph never seen", "other_gpu": "graph known, other GPU",
                 "other_versions": "graph known, other torch/triton",
                 "other_compiler": "graph known, other kiln compiler"}


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Columns sized to fit; numbers (counts, shares, ages) right-aligned, text left."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_NUMBER.match(r[i]) for r in cells[1:]) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if num else c.ljust(w)
                         for c, w, num in zip(row, widths, numeric, strict=True)).rstrip()

    return "\n".join([line(cells[0]), "  ".join("-" * w for w in widths),
                      *(line(r) for r in cells[1:])])


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_age(text: str) -> float:
    """Seconds from `30d`, `12h`, `90m`, `45s` or `2w` (argparse type)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", text.lower())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age: a number with s, m, h, d or "
                                         "w (30d, 12h)")
    return float(match.group(1)) * _AGE_UNITS[match.group(2)]


def _size(text: str) -> int:
    try:
        return kiln_config.parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ago(seconds: float) -> str:
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{seconds / span:.1f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _config() -> kiln_config.Config:
    try:
        return kiln_config.current()
    except ValueError as exc:
        raise SystemExit(f"kiln: invalid configuration: {exc}") from None


# -- kiln cache -------------------------------------------------------------------------------

def cache_summary(cache: ScheduleCache, plans: PlanCache | None = None) -> dict[str, Any]:
    """What the cache holds: entries by status (`unreadable`: corrupt or foreign files),
    bytes, the cap, and when its least and most recently used entries were used; with
    `plans`, how many plans (kiln.plans) and their bytes."""
    files = list(cache.scan())
    counts = {"tuned": 0, "heuristic": 0, "unreadable": 0}
    for f in files:
        entry = cache.peek(f.key)
        counts[entry.status if entry is not None else "unreadable"] += 1
    used = [f.used for f in files]
    summary = {"directory": str(cache.root), "entries": len(files), **counts,
               "bytes": sum(f.size for f in files), "max_bytes": cache.max_bytes,
               "least_recently_used": _iso(min(used)) if used else None,
               "most_recently_used": _iso(max(used)) if used else None}
    if plans is not None:
        plan_files = list(plans.scan())
        summary["plans"] = {"directory": str(plans.root), "entries": len(plan_files),
                            "bytes": sum(f.size for f in plan_files)}
    return summary


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds")


def format_cache(summary: dict[str, Any]) -> str:
    """The cache summary, one labelled line each."""
    cap = summary["max_bytes"]
    size = human_bytes(summary["bytes"])
    if cap:
        share = 100 * summary["bytes"] / cap
        size += f" of {human_bytes(cap)} ({share:.1f}%, KILN_CACHE_MAX_BYTES)"
    entries = f"{summary['entries']} (tuned {summary['tuned']}, heuristic {summary['heuristic']}"
    if summary["unreadable"]:
        entries += f", unreadable {summary['unreadable']}: dropped when read"
    rows = [("kiln schedule cache", summary["directory"]), ("entries", entries + ")"),
            ("size", size)]
    if "plans" in summary:
        plans = summary["plans"]
        rows.append(("plans", f"{plans['entries']} ({human_bytes(plans['bytes'])}) in "
                              f"{plans['directory']}"))
    now = time.time()
    for label, name in (("least recently used", "least_recently_used"),
                        ("most recently used", "most_recently_used")):
        if summary[name]:
            at = datetime.fromisoformat(summary[name]).timestamp()
            rows.append((label, f"{summary[name]} ({_ago(now - at)})"))
    width = max(len(label) for label, _ in rows)
    return "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows)


def cmd_cache(args: argparse.Namespace) -> int:
    """Show the local schedule cache."""
    config = _config()
    summary = cache_summary(ScheduleCache(config.schedule_dir, config.cache_max_bytes),
                            PlanCache(config.plan_dir, config.cache_max_bytes))
    print(json.dumps(summary, indent=2) if args.json else format_cache(summary))
    return 0


def cmd_cache_prune(args: argparse.Namespace) -> int:
    """Remove old entries, then the least recently used past a size: schedules, and plans
    (kiln.plans) by the same rules."""
    config = _config()
    max_bytes = args.max_size if args.max_size is not None else config.cache_max_bytes
    verb = "would remove" if args.dry_run else "removed"
    for what, cache in (("entries", ScheduleCache(config.schedule_dir, config.cache_max_bytes)),
                        ("plans", PlanCache(config.plan_dir, config.cache_max_bytes))):
        result = cache.prune(max_bytes=max_bytes, older_than_s=args.older_than,
                             dry_run=args.dry_run)
        print(f"kiln cache prune: {verb} {result.removed} {what} "
              f"({human_bytes(result.freed_bytes)}); {result.kept} {what} "
              f"({human_bytes(result.kept_bytes)}) kept in {cache.root}")
    return 0


# -- kiln stats -------------------------------------------------------------------------------

def fetch_stats(url: str | None, token: str | None) -> dict[str, Any]:
    """`GET /v1/admin/stats` from the service at `url`; one-line SystemExit on failure."""
    if not url:
        raise SystemExit("kiln stats: KILN_URL is off; set it to the service (--url)")
    try:
        client = ServiceClient(url, token, connect_timeout=5.0, request_timeout=15.0, retries=1)
        return client.admin_stats()
    except ValueError as exc:  # not an http(s) URL
        raise SystemExit(f"kiln stats: {exc}") from None
    except ServiceError as exc:
        if exc.cause == "auth":
            hint = ("no admin token: set KILN_ADMIN_TOKEN (`kiln token create --role admin`)"
                    if not token else "the service refused the token: KILN_ADMIN_TOKEN (or "
                    "KILN_TOKEN) must be an admin token")
            raise SystemExit(f"kiln stats: {hint}") from None
        if exc.cause in ("unreachable", "timeout"):
            raise SystemExit(f"kiln stats: {exc}; is `kiln serve` running there? (KILN_URL)") \
                from None
        raise SystemExit(f"kiln stats: {url}: {exc}") from None


def _percent(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def format_stats(stats: dict[str, Any], url: str) -> str:
    """The admin stats answer as tables: entries, lookups, queue, workers."""
    by_status = stats.get("entries_by_status") or {}
    total = sum(by_status.values())
    entries = [[status, n, _percent(n, total)] for status, n in by_status.items()]
    entries.append(["total", total, ""])
    ready, fraction = stats.get("gpu_entries_ready") or 0, stats.get("tuned_fraction")
    tuned = (f"tuned fraction: {100 * fraction:.1f}% of {ready} GPU entries with a schedule"
             if fraction is not None else "tuned fraction: - (no GPU entry has a schedule yet)")
    hits, misses = stats.get("hits", 0), stats.get("misses", 0)
    lookups = [["hits", hits, _percent(hits, hits + misses)],
               ["misses", misses, _percent(misses, hits + misses)]]
    lookups += [[f"  {_MISS_REASONS.get(reason, reason)}", n, _percent(n, hits + misses)]
                for reason, n in (stats.get("misses_by_reason") or {}).items()]
    queue = [[stream, n] for stream, n in sorted((stats.get("queue_depth") or {}).items())]
    waiting = stats.get("jobs_waiting") or {}
    jobs = [[stage, w.get("queued", 0), w.get("running", 0)]
            for stage, w in sorted(waiting.items())]
    workers = [[w.get("device", "?"), w.get("queue_class", "?"), w.get("status", "?"),
                f"{w.get('heartbeat_age_s', 0):.0f}s", w.get("current_job") or "-"]
               for w in stats.get("workers") or []]
    if "plans" in stats:  # kiln.plans: AOTAutograd's results, by dynamo graph
        tuned += f"\nplans: {stats['plans']} (dynamo graphs a client may compile without AOTAutograd)"
    parts = [f"kiln service {url}", table(["entries", "count", "share"], entries), tuned,
             table(["lookups", "count", "share"], lookups),
             table(["jobs", "queued", "running"], jobs) if jobs else "jobs: none queued or running",
             table(["queue stream", "depth"], queue) if queue else
             "queue: no stream yet (or Redis unreachable)",
             table(["worker", "queue", "status", "heartbeat", "job"], workers) if workers else
             "workers: none seen in the last hour"]
    return "\n\n".join(parts)


def show_stats(args: argparse.Namespace, token: str | None) -> int:
    """`kiln stats`: print the service's stats (`--json`: the admin API's answer as is)."""
    url = args.url if args.url is not None else _config().url
    stats = fetch_stats(url, token)
    print(json.dumps(stats, indent=2) if args.json else format_stats(stats, url or ""))
    return 0


def add_parsers(sub: Any, stats_command: Any) -> None:
    """`kiln stats` and `kiln cache` on the CLI's subparsers; `stats_command(args)` finds
    the admin token (kiln.cli) and calls `show_stats`."""
    stats = sub.add_parser("stats", help="the service's entries, hits and misses, queue and "
                           "workers (admin API at KILN_URL, with KILN_ADMIN_TOKEN)")
    stats.add_argument("--url", default=None, help="the service (default: KILN_URL)")
    stats.add_argument("--json", action="store_true", help="print the admin API's JSON")
    stats.set_defaults(func=stats_command)

    cache = sub.add_parser("cache", help="this machine's schedule cache (KILN_CACHE_DIR): size, "
                           "entries; `prune`")
    cache.add_argument("--json", action="store_true", help="print the summary as JSON")
    cache.set_defaults(func=cmd_cache)
    cache_sub = cache.add_subparsers(dest="cache_command")
    prune = cache_sub.add_parser("prune", help="remove entries unused for a time, then the "
                                 "least recently used past a size")
    prune.add_argument("--max-size", type=_size, default=None, metavar="SIZE",
                       help="keep at most SIZE (512M, 1G; 0 empties the cache; default: "
                            "KILN_CACHE_MAX_BYTES)")
    prune.add_argument("--older-than", type=parse_age, default=None, metavar="AGE",
                       help="remove entries unused for AGE (30d, 12h)")
    prune.add_argument("--dry-run", action="store_true", help="count, remove nothing")
    prune.set_defaults(func=cmd_cache_prune)
