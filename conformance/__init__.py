"""Conformance suite: a pytest plugin and its suites; writes the record the loader reads."""
