"""Summarize the per-run JSON files tck_gateway_plugin.py writes into RESULTS_DIR/summary.md.

usage: python summarize.py RESULTS_DIR [HEADER_FILE]
       python summarize.py --check RESULTS_DIR   (exit 1 when a native MUST test failed)

Counts per SUT x binding: passed / failed (+errors) / skipped because the test belongs to another
binding ("other-binding") / skipped for any other reason ("skipped": a precondition the SUT did
not meet, a capability it does not declare, ...) / xfailed / xpassed, split by RFC 2119 level.
Then the failing tests of each run, and the differences between the reference agent run directly
and through the gateway ("fronted").
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

BINDINGS = ("grpc", "jsonrpc", "http_json")
LEVELS = ("MUST", "SHOULD", "MAY", "UNMARKED")
OTHER_BINDING = re.compile(r"not configured")


def load(path: Path) -> list[dict]:
    return json.loads(path.read_text())["tests"]


def bucket(test: dict) -> str:
    outcome = test["outcome"]
    if outcome == "skipped" and OTHER_BINDING.search(test["message"]):
        return "other-binding"
    if outcome == "error":
        return "failed"
    return outcome


def short(nodeid: str) -> str:
    return nodeid.replace("tests/compatibility/", "")


def one_line(message: str, width: int = 230) -> str:
    text = " ".join(message.split())
    text = re.sub(r"\s*\(see specification/specification\.md#[^)]*\)", "", text)
    text = text.replace("AssertionError: ", "")
    return text[:width]


def table(runs: dict[str, list[dict]]) -> list[str]:
    cols = ("passed", "failed", "skipped", "other-binding", "xfailed", "xpassed")
    lines = [
        "| run | level | " + " | ".join(cols) + " |",
        "|---|---|" + "---|" * len(cols),
    ]
    for name, tests in runs.items():
        per_level: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for test in tests:
            per_level[test["level"]][bucket(test)] += 1
            per_level["all"][bucket(test)] += 1
        for level in (*LEVELS, "all"):
            if level not in per_level:
                continue
            counts = per_level[level]
            label = f"**{level}**" if level == "all" else level
            lines.append(f"| {name} | {label} | " + " | ".join(str(counts[c]) for c in cols) + " |")
    return lines


def check(results: Path) -> int:
    """Print every native MUST failure; 1 if there is one, else 0."""
    failed = [
        f"{path.stem}: {short(test['nodeid'])}: {one_line(test['message'])}"
        for path in sorted(results.glob("native-*.json"))
        for test in load(path)
        if test["level"] == "MUST" and bucket(test) == "failed"
    ]
    print("\n".join(failed) if failed else "no native MUST failure")
    return 1 if failed else 0


def main() -> None:
    if sys.argv[1] == "--check":
        sys.exit(check(Path(sys.argv[2])))
    results = Path(sys.argv[1])
    out: list[str] = []
    if len(sys.argv) > 2 and Path(sys.argv[2]).exists():
        out += [*Path(sys.argv[2]).read_text().splitlines(), ""]
    runs: dict[str, list[dict]] = {}
    for sut in ("native", "direct", "fronted"):
        for binding in BINDINGS:
            path = results / f"{sut}-{binding}.json"
            if path.exists():
                runs[f"{sut}-{binding}"] = load(path)
    out += ["## Counts per SUT x binding", "", *table(runs), ""]
    out += [
        "`other-binding`: parametrized for a binding not selected in this run (not a result).",
        "`skipped`: the kit skipped it for this SUT (capability not declared, precondition not"
        " met).",
        "",
    ]
    for name, tests in runs.items():
        failing = [t for t in tests if bucket(t) == "failed"]
        out += [f"## Failing in {name} ({len(failing)})", ""]
        for test in failing:
            nodeid, message = short(test["nodeid"]), one_line(test["message"])
            out.append(f"- [{test['level']}] `{nodeid}`: {message}")
        out.append("")
    for binding in BINDINGS:
        direct = {t["nodeid"]: t for t in runs.get(f"direct-{binding}", [])}
        fronted = {t["nodeid"]: t for t in runs.get(f"fronted-{binding}", [])}
        if not direct or not fronted:
            continue
        groups: dict[str, list[str]] = collections.defaultdict(list)
        for nodeid in sorted(set(direct) & set(fronted)):
            a, b = direct[nodeid], fronted[nodeid]
            ba, bb = bucket(a), bucket(b)
            if ba == bb or "other-binding" in (ba, bb):
                continue
            reason = one_line(b["message"]) if bb in ("failed", "skipped") else ""
            line = f"- [{a['level']}] `{short(nodeid)}` {reason}"
            groups[f"direct {ba} -> fronted {bb}"].append(line)
        out += [f"## direct vs fronted, {binding}", ""]
        if not groups:
            out.append("- no differences")
        regressions_first = sorted(
            groups, key=lambda t: (not t.startswith("direct passed -> fronted failed"), t)
        )
        for title in regressions_first:
            out += [f"### {title} ({len(groups[title])})", "", *groups[title], ""]
        out.append("")
    unfixed = results / "unfixed"
    if unfixed.is_dir():
        extra = {p.stem: load(p) for p in sorted(unfixed.glob("*.json"))}
        if extra:
            out += ["## Without the kit fixes (TCK_KIT_FIXES=none)", "", *table(extra), ""]
    (results / "summary.md").write_text("\n".join(out) + "\n")
    print("\n".join(out))


if __name__ == "__main__":
    main()
