"""The one error type of onboarding: a request refused before anything was written."""

from __future__ import annotations


class OnboardError(ValueError):
    """Raised for a request that cannot be carried out; the message says why and what would do."""
