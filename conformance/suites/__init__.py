"""Suites of the conformance run, one module per area."""
