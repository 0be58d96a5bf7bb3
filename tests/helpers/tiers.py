"""The tiers of the suite and where tests go: what the root conftest and the suite's rules share.

A test with any of ``TIER_MARKERS`` is in the rest tier; every other test is fast.
"""

from __future__ import annotations

TIER_MARKERS = ("slow", "postgres", "interop", "spire", "fuzz", "netns", "browser")
"""A test with any of these markers is in the rest tier; every other test is fast."""

FOLDER_MARKERS = {"interop": "interop", "spire": "spire", "faults": "slow", "deploy": "slow"}
"""Folders (under tests/) whose every test carries a marker without saying so: crashes,
outages and signals (tests/faults/) take agent processes and real waits, and the
deployments (tests/deploy/) build images and run systemd."""

POSTGRES_FIXTURES = frozenset({"postgres_cluster", "pg_dsn"})
"""Fixtures that start PostgreSQL: a test naming one is marked ``postgres``."""

SUITES = {
    "helpers": "what tests share (no tests)",
    "security": "adversarial suites and fuzzing across the packages",
    "faults": "crashes, storage failures, outages, signals",
    "interop": "clients that are not ours: other languages, the A2A TCK",
    "spire": "identities from a real SPIRE server",
    "deploy": "the deployments of docs/deploy.md",
    "docs": "the docs' snippets and links",
}
"""Test folders that cut across the packages; every other folder mirrors one."""

PACKAGE_ROOTS = ("gateway", "capabilities", "policies")
"""Where tests/<path>/ may point: gateway/<path>, or capabilities/ and policies/ themselves."""

PROCESS_STARTERS = ("AgentProcess(", "two_worker_agent(", "serve_alice(")
"""Calls that start ``a2a-gateway serve`` as a process: the tests making them are slow."""

REVIEW_WORDS = ("probe", "review", "fixes", "regression")
"""Words of a file named after the review that found a bug, not after what it tests."""
