"""What can go wrong with the processes the runtime starts."""

from __future__ import annotations


class RuntimeStartError(RuntimeError):
    """A fork server or a child could not be started."""


class SandboxUnavailable(RuntimeError):
    """Isolation was asked for, but this machine cannot provide it (no bubblewrap, no user
    namespaces); the message says what is missing and how to install it."""
