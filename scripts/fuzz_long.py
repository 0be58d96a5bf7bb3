"""Long Invoke or A2A fuzz run against one real agent on loopback (by hand, not in CI).

Run from the repository root::

    python scripts/fuzz_long.py                      # 10,000 cases, at most 30 minutes
    python scripts/fuzz_long.py --cases 50000 --max-seconds 3600 --seed 7
    python scripts/fuzz_long.py --binding a2a --cases 2000 --max-seconds 300

``--binding a2a`` sends the cases of ``tests/helpers/a2a_fuzz.py`` instead
(every ``lf.a2a.v1.A2AService`` method, one call at a time, nine in ten
well-formed requests, half of them SendMessage, one in ten raw bytes) and
checks each as that module says; the end checks are the same.

It makes a temporary PKI, starts one agent on 127.0.0.1:0 (the harness of
``tests/helpers/fuzz_invoke.py``), and sends it, one call at a time, the cases of
the same generators as ``tests/security/test_fuzz_invoke.py``: nine in ten are
whole Invoke requests, one in ten raw request bytes. Every case is checked as
in the tests (expected status with ErrorInfo; exactly one outcome audit record,
after one write-ahead ``ADMITTED`` record for an admitted write; no payload text
in any record; the write capability run only for a fresh OK). At the end a
plain echo must still succeed, the log must hold exactly the records the calls
added and its hash chain must verify.

Prints a summary table. Exits 1 on any broken invariant, a crash of the
harness, a missing audit record or a server that stopped serving; 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hypothesis import HealthCheck, Phase, Verbosity, given, seed, settings
from hypothesis import strategies as st

from gateway.audit import verify_chain
from gateway.storage import open_audit_reader
from tests.helpers.a2a_fuzz import a2a_cases, check_a2a, describe_case
from tests.helpers.agents import make_pki
from tests.helpers.fuzz_invoke import (
    FUZZ_CALLERS,
    CaseResult,
    FuzzTarget,
    check_invoke,
    check_raw,
    invoke_cases,
    raw_requests,
)

MAX_SAMPLES = 20
"""Failing cases printed in full (the rest are only counted)."""


class _OutOfTime(Exception):
    """Raised inside the generated test to end the run at --max-seconds."""


@dataclass
class Tally:
    """Everything the run saw."""

    cases: int = 0
    calls: int = 0
    records: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    problems: Counter[str] = field(default_factory=Counter)
    failed_cases: int = 0
    samples: list[str] = field(default_factory=list)
    crash: str = ""

    def add(self, kind: str, result: CaseResult, case: object) -> None:
        """Count one case's result (and keep it if it broke an invariant)."""
        self.cases += 1
        self.calls += 1
        self.records += result.records
        self.kinds[kind if result.reached_gateway else f"{kind} (undecodable)"] += 1
        self.statuses[f"{result.code.name} {result.reason}"] += 1
        if result.problems:
            self.failed_cases += 1
            for problem in result.problems:
                self.problems[problem[:100]] += 1
            if len(self.samples) < MAX_SAMPLES:
                self.samples.append(f"{result.problems}\n    case: {str(case)[:400]}")


def run(
    target: FuzzTarget,
    tally: Tally,
    *,
    cases: int,
    max_seconds: float,
    seed_value: int | None,
    binding: str = "invoke",
) -> None:
    """Drive ``cases`` generated cases through ``target``, stopping at ``max_seconds``."""
    stop_at = time.monotonic() + max_seconds
    raw_case = st.tuples(st.just("raw"), st.tuples(st.sampled_from(FUZZ_CALLERS), raw_requests()))
    invoke_case = st.tuples(st.just("invoke"), invoke_cases())
    any_case = st.integers(0, 9).flatmap(lambda n: raw_case if n == 9 else invoke_case)
    if binding == "a2a":
        any_case = st.tuples(st.just("a2a"), a2a_cases())

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        phases=[Phase.generate],  # a fuzz run: no shrinking, keep going after failures
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,
    )
    @given(item=any_case)
    def one_case(item: tuple[str, Any]) -> None:
        if time.monotonic() > stop_at:
            raise _OutOfTime
        kind, case = item
        if kind == "a2a":
            shown = case.method if case.request is not None else f"{case.method} (raw bytes)"
            tally.add(shown, check_a2a(target, case), describe_case(case))
        elif kind == "raw":
            caller, (raw, token) = case
            tally.add(kind, check_raw(target, caller, raw, token), raw)
        else:
            tally.add(kind, check_invoke(target, case), case)

    try:
        (one_case if seed_value is None else seed(seed_value)(one_case))()
    except _OutOfTime:
        pass


def summary(
    tally: Tally, target: FuzzTarget, seconds: float, binding: str = "invoke"
) -> tuple[str, bool]:
    """The report, and whether every check held."""
    serving = target.echo_still_works()
    target.flush_audit()
    records = target.audit_seq()
    expected_records = tally.records + 1  # the final echo
    chain = verify_chain(open_audit_reader(target.agent.config.audit_db))
    ok = (
        not tally.crash
        and tally.failed_cases == 0
        and serving
        and records == expected_records
        and chain.ok
    )
    lines = [
        f"fuzz_long: {'A2A' if binding == 'a2a' else 'Invoke'} fuzzing over mTLS"
        f" against one agent on {target.agent.address}",
        "",
        f"{'cases':<42}{tally.cases:>10}",
        f"{'duration (s)':<42}{seconds:>10.1f}",
        f"{'cases per second':<42}{tally.cases / max(seconds, 1e-9):>10.1f}",
        f"{'failed cases':<42}{tally.failed_cases:>10}",
        f"{'calls':<42}{tally.calls:>10}",
        *(
            [f"{'audit records the calls added':<42}{tally.records:>10}"]
            if binding == "a2a"  # answered reads add none
            else [f"{'  of which write-ahead (ADMITTED) too':<42}{tally.records - tally.calls:>10}"]
        ),
        f"{'audit records in the log':<42}{records:>10}  expected {expected_records}"
        " (what the calls added, the final echo)",
        f"{'audit chain verifies':<42}{'yes' if chain.ok else 'NO':>10}",
        f"{'server still serving':<42}{'yes' if serving else 'NO':>10}",
        f"{'harness crash':<42}{'yes' if tally.crash else 'no':>10}",
        "",
        f"{'KIND':<42}{'CASES':>10}",
        *(f"{kind:<42}{n:>10}" for kind, n in tally.kinds.most_common()),
        "",
        f"{'STATUS REASON':<42}{'CASES':>10}",
        *(f"{status:<42}{n:>10}" for status, n in sorted(tally.statuses.items())),
    ]
    if tally.problems:
        lines += ["", f"{'PROBLEM':<90}{'CASES':>10}"]
        lines += [f"{p:<90}{n:>10}" for p, n in tally.problems.most_common()]
        lines += ["", "first failing cases:", *(f"  {s}" for s in tally.samples)]
    if tally.crash:
        lines += ["", "harness crash:", tally.crash]
    lines += ["", "RESULT: " + ("PASS" if ok else "FAIL")]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases to run (10000)")
    parser.add_argument(
        "--max-seconds", type=float, default=1800.0, help="stop after this long (1800)"
    )
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (random)")
    parser.add_argument(
        "--binding", choices=("invoke", "a2a"), default="invoke", help="what to fuzz (invoke)"
    )
    args = parser.parse_args(argv)
    if args.cases < 1 or args.max_seconds <= 0:
        parser.error("--cases and --max-seconds must be positive")
    tally = Tally()
    with tempfile.TemporaryDirectory(prefix="fuzz-long-") as tmp:
        base = Path(tmp)
        target = FuzzTarget(make_pki(base), base)
        if not target.agent.address.startswith("127.0.0.1:"):
            raise SystemExit(f"refusing to fuzz a non-loopback address {target.agent.address}")
        started = time.monotonic()
        try:
            run(
                target,
                tally,
                cases=args.cases,
                max_seconds=args.max_seconds,
                seed_value=args.seed,
                binding=args.binding,
            )
        except Exception:
            tally.crash = traceback.format_exc()
        seconds = time.monotonic() - started
        try:
            report, ok = summary(tally, target, seconds, args.binding)
        finally:
            target.close()
    print(report)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
