"""Operator-only code, run by the CLI and never by a serving agent."""
