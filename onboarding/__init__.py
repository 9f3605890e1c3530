"""Onboarding: render a new platform's files from the descriptor model and jinja2 templates."""
