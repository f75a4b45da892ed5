"""Every Redis key kiln uses, in one place. All start with the configured prefix."""

from __future__ import annotations

GROUP = "workers"  # the consumer group every stream carries


def fair_base(prefix: str, name: str) -> str:
    """The start of every key of stream `name` (`build` or `tune:<queue class>`); after it:
    `|t:<tenant>` a tenant's line (a Redis stream of job ids), `|tenants` every tenant that
    has a line, `|ready` the tenants with undelivered messages (a sorted set: lowest score
    is served next), `|turn` the turn counter, `|busy` the tenants with delivered messages
    not yet acked (scanned for expired leases), `|wake` tokens that wake blocked consumers.
    Tenant names never hold `|` (service/tenants.py)."""
    return f"{prefix}fq:{name}"


def tenant_line(prefix: str, name: str, tenant: str) -> str:
    """The line of one tenant in stream `name`."""
    return f"{fair_base(prefix, name)}|t:{tenant}"


def legacy_stream(prefix: str, name: str) -> str:
    """The one stream per name that kiln used before fair queueing; read only to move its
    messages into tenants' lines when a deployment is upgraded."""
    return f"{prefix}stream:{name}"


def streams_index(prefix: str) -> str:
    """A set of the stream names in use, so depth can be reported without SCAN."""
    return f"{prefix}streams"


def epoch(prefix: str) -> str:
    """A marker written once; finding it missing means Redis lost its data."""
    return f"{prefix}epoch"


def rate_bucket(prefix: str, ident: str) -> str:
    """The per-token rate limit bucket (a hash: tokens, at) shared by every API process."""
    return f"{prefix}rate:{ident}"


def auth_failures(prefix: str, ident: str) -> str:
    """The failed authentications of one identity (`token:<hash prefix>` or `ip:<address>`):
    a hash of count, last and until."""
    return f"{prefix}authfail:{ident}"
