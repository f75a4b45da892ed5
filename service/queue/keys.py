"""Every Redis key kiln uses, in one place. All start with the configured prefix."""

from __future__ import annotations

GROUP = "workers"  # the consumer group every stream carries


def stream(prefix: str, name: str) -> str:
    """The stream holding job ids for `name` (`build` or `tune:<queue class>`)."""
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
