"""Per-peer rate and concurrency limits, the server-wide cap, and how refusals are audited.

``admission`` decides, ``shared_table`` holds the counts the workers of one agent
share, ``refusal_log`` writes limit refusals to the audit log.
"""
