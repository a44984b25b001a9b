"""What stops `procdelta top`, in one line for the person who ran it."""

from __future__ import annotations


class TopError(Exception):
    """What stops `top`, in one line for the person who ran it: the work could not be
    done (a server unreachable or refusing, PIDs that are not this node's)."""


class BadValue(TopError):
    """The invocation is wrong: a value `top` cannot take, or options that do not go
    together."""
