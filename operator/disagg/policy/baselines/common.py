"""What every baseline step returns: the new replica count of each role that changes."""

from __future__ import annotations

Targets = dict[str, int]
