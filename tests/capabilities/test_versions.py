"""Version parsing and constraint resolution."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from capabilities.versions import Version, VersionConstraint, VersionSyntaxError

VERSIONS = [
    Version.parse(v) for v in ["0.1.0", "0.2.3", "1.0.0", "1.2.0", "1.2.5", "1.3.0", "2.0.0"]
]


@pytest.mark.parametrize(
    ("constraint", "expected"),
    [
        ("", "2.0.0"),
        ("*", "2.0.0"),
        ("1", "1.3.0"),
        ("1.2", "1.2.5"),
        ("^1.2", "1.3.0"),
        (">=1.0,<2", "1.3.0"),
        ("1.2.5", "1.2.5"),
        ("=1.2.0", "1.2.0"),
        ("~1.2", "1.2.5"),
        (">1.2.5", "2.0.0"),
        ("<1", "0.2.3"),
        ("^0.2", "0.2.3"),
        ("<=1.2.0", "1.2.0"),
        ("1.2.3", None),
        ("^3", None),
        (">=2.0.1", None),
    ],
)
def test_constraint_resolves_to_highest_match(constraint: str, expected: str | None) -> None:
    best = VersionConstraint.parse(constraint).highest(VERSIONS)
    assert (str(best) if best else None) == expected


@pytest.mark.parametrize(
    "bad", [">>1", "1.x", "01.2", "^", "1.2.3.4", "a", ">=1,,<2", "1 2", "x" * 200]
)
def test_malformed_constraints_are_refused(bad: str) -> None:
    with pytest.raises(VersionSyntaxError):
        VersionConstraint.parse(bad)


@pytest.mark.parametrize("bad", ["1", "1.2", "v1.2.3", "1.2.3-rc1", "01.0.0", "1.2.3\n"])
def test_malformed_versions_are_refused(bad: str) -> None:
    with pytest.raises(VersionSyntaxError):
        Version.parse(bad)


versions = st.builds(Version, st.integers(0, 30), st.integers(0, 30), st.integers(0, 30))


@given(version=versions)
def test_exact_and_caret_admit_the_version_itself(version: Version) -> None:
    assert VersionConstraint.parse(str(version)).allows(version)
    assert VersionConstraint.parse(f"^{version}").allows(version)
    assert VersionConstraint.parse(f">={version},<={version}").allows(version)


@given(base=versions, other=versions)
def test_caret_never_crosses_the_leftmost_nonzero_part(base: Version, other: Version) -> None:
    if VersionConstraint.parse(f"^{base}").allows(other):
        assert other >= base
        if base.major:
            assert other.major == base.major
        elif base.minor:
            assert (other.major, other.minor) == (0, base.minor)
        else:
            assert other == base


@given(
    pool=st.lists(versions, max_size=12),
    constraint=st.sampled_from(["", "1", "^1.2", ">=1.0,<2", "~0.3", "<5", "2.1"]),
)
def test_highest_is_the_maximum_of_the_allowed(pool: list[Version], constraint: str) -> None:
    parsed = VersionConstraint.parse(constraint)
    allowed = [v for v in pool if parsed.allows(v)]
    assert parsed.highest(pool) == (max(allowed) if allowed else None)


@pytest.mark.parametrize("bad", ["1\u0661", "\u0661.0.0", "^1.\u0662"])
def test_only_ascii_digits_are_versions(bad: str) -> None:
    with pytest.raises(VersionSyntaxError):
        VersionConstraint.parse(bad)
