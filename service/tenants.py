"""Tenants: who shares what a client writes for other clients to run.

Every token belongs to one tenant (`kiln token create --tenant NAME`); anonymous callers of
a loopback bind are the one tenant `local` (any process of the machine can be one). Plans
are client-written code that another client's job would run, so each tenant sees only its
own, plus the ones an admin published to all (stored under the tenant `*`). Schedules and
binaries stay shared: the service's own workers make them from the graph.
"""

from __future__ import annotations

import re

DEFAULT_TENANT = "default"  # a token created without --tenant, and every row before tenants
LOCAL_TENANT = "local"  # anonymous callers of a loopback bind
ALL_TENANTS = "*"  # an admin's published plans: seen by every tenant

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_tenant(name: str) -> str:
    """`name` when it can name a tenant (1-64 letters, digits, `.`, `_`, `-`, starting with
    a letter or digit; so never `*`); ValueError saying why otherwise."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(f"a tenant name is 1-64 letters, digits, '.', '_' or '-', starting "
                         f"with a letter or digit, not {str(name)[:80]!r}")
    return name
