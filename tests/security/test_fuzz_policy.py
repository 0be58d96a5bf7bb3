"""Fuzzing policy files: ``load_policy`` returns a Policy or a PolicyFileError, nothing else.

Inputs: structured documents (the right keys with values of random types,
rendered to TOML), TOML-ish text built from policy fragments and noise, and
arbitrary bytes. A PolicyFileError's message starts with the file; a running
agent's ``PolicyStore.reload()`` only ever swaps in a file that loads.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import date, datetime, time, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gateway.errors import PolicyFileError
from policies.grants import MAX_PAYLOAD_CEILING
from policies.policy_file import Policy, load_policy, render_policy
from policies.store import PolicyStore
from tests.helpers.agents import grant, write_policy

pytestmark = pytest.mark.fuzz

POLICY_SETTINGS = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# --- rendering any value as TOML ------------------------------------------------


def toml_string(text: str) -> str:
    """A TOML basic string; control characters and lone surrogates are escaped."""
    out = []
    for char in text:
        code = ord(char)
        if char in '"\\':
            out.append("\\" + char)
        elif code < 0x20 or code == 0x7F or 0xD800 <= code <= 0xDFFF:
            out.append(f"\\u{code:04x}")  # a surrogate escape is invalid TOML: also fine
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def toml_value(value: Any) -> str:
    """``value`` as an inline TOML value (arrays and inline tables for containers)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(doc: dict[str, Any], tables: bool) -> str:
    """A whole file: scalars first, then lists of tables as ``[[name]]`` when ``tables``."""
    lines = [f"{toml_string(k)} = {toml_value(v)}" for k, v in doc.items() if not _table_list(v)]
    for key, value in doc.items():
        if not _table_list(value):
            continue
        if not tables:
            lines.append(f"{toml_string(key)} = {toml_value(value)}")
            continue
        for table in value:
            lines.append(f"[[{toml_string(key)}]]")
            lines += [f"{toml_string(k)} = {toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _table_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


# --- generators --------------------------------------------------------------------

offsets = st.integers(-1439, 1439).map(lambda m: timezone(timedelta(minutes=m)))
aware_datetimes = st.datetimes(timezones=offsets).map(lambda d: d.replace(microsecond=0))

toml_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(),
    st.text(max_size=30),
    aware_datetimes,
    st.datetimes(),
    st.dates(),
    st.times(),
)
toml_values = st.recursive(
    toml_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)

PEERS = (
    "spiffe://example.org/agent/bob",
    "spiffe://example.org/agent/carol",
    "spiffe://e.org/a/b.c_d-e",
)
peers = st.one_of(
    st.sampled_from(PEERS),
    st.sampled_from(
        ["spiffe://example.org", "spiffe://Example.org/a", "spiffe://e.org/a/..", "bob", ""]
    ),
    st.text(max_size=40),
    toml_values,
)

capability_entries = st.one_of(
    st.sampled_from(
        ["text.echo", "text.echo@^1", "kv.put@1", "kv.get@>=1.0,<2", " text.search @ ~1.0 "]
    ),
    st.builds(
        lambda name, op, version: f"{name}@{op}{version}",
        st.sampled_from(["text.echo", "kv.put", "Text.Echo", "a..b", "x"]),
        st.sampled_from(["", "^", "~", ">=", "<", "=", "==", ">>", "!"]),
        st.from_regex(r"[0-9\u0661]{1,10}(\.[0-9]{1,3}){0,3}", fullmatch=True),
    ),
    st.text(max_size=30),
    st.fixed_dictionaries(
        {"name": st.sampled_from(["text.echo", "x y"])},
        optional={
            "constraint": st.sampled_from(["^1", ">>1", ""]),
            "extra": toml_scalars,
        },
    ),
    toml_scalars,
)

payload_caps = st.one_of(
    st.integers(1, MAX_PAYLOAD_CEILING),
    st.sampled_from([-1, 0, MAX_PAYLOAD_CEILING + 1, 2**63 - 1, -(2**63)]),
    st.floats(),
    st.text(max_size=10),
    st.booleans(),
)

expiries = st.one_of(
    aware_datetimes,
    st.datetimes(),
    st.dates(),
    st.times(),
    aware_datetimes.map(lambda d: d.isoformat()),
    st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01", "tomorrow", "", "2030-13-01T00:00Z"]),
    st.integers(),
)

risks = st.one_of(
    st.sampled_from(["read", "write", "external", "READ", "nuclear", ""]), toml_scalars
)


def _table(
    required: dict[str, st.SearchStrategy[Any]], optional: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    """A table whose keys are usually present; sometimes one more, unknown, key."""
    extra = st.dictionaries(st.sampled_from(["allow_all", "peers", "Peer", ""]), toml_values)
    return st.builds(
        lambda base, more, drop: {k: v for k, v in (base | more).items() if k not in drop},
        st.fixed_dictionaries(required, optional=optional),
        extra | st.just({}),
        st.just(set()) | st.sets(st.sampled_from(sorted(required) or [""]), max_size=1),
    )


grant_tables = _table(
    {
        "peer": peers,
        "capabilities": st.lists(capability_entries, max_size=4) | toml_values,
        "max_payload_bytes": payload_caps,
        "expires_at": expiries,
    },
    {"max_risk": risks},
)
outbound_tables = _table(
    {"peer": peers, "capabilities": st.lists(capability_entries, max_size=3) | toml_values}, {}
)

documents = _table(
    {},
    {
        "version": st.sampled_from([1, 2, 0, "1", 1.0, True]) | toml_scalars,
        "grants": st.lists(grant_tables, max_size=3) | toml_values,
        "outbound": st.lists(outbound_tables, max_size=2) | toml_values,
    },
)

FRAGMENTS = (
    "version = 1",
    "[[grants]]",
    "[[outbound]]",
    "[grants]",
    'peer = "spiffe://example.org/agent/bob"',
    'capabilities = ["text.echo@^1"]',
    "capabilities = [",
    "max_payload_bytes = 4096",
    "expires_at = 2030-01-01T00:00:00Z",
    'expires_at = "2030-01-01T00:00:00"',
    'max_risk = "write"',
    "grants = []",
    "grants.peer = 1",
    'x = """',
    "[[grants.capabilities]]",
    "= 1",
)
toml_ish_text = st.lists(
    st.sampled_from(FRAGMENTS) | st.text(max_size=30), min_size=0, max_size=12
).map("\n".join)


# --- properties ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz-policy")


def load_outcome(path: Path) -> Policy | PolicyFileError:
    """What load_policy did: a Policy, or the PolicyFileError it raised (anything else escapes)."""
    try:
        return load_policy(path)
    except PolicyFileError as err:
        return err


def assert_names_the_file(error: PolicyFileError, path: Path) -> None:
    # Only the start: one line per problem, but a key or peer written in the
    # file may itself hold a newline, and it is copied into the message as is.
    assert error.message.startswith(f"{path}: "), error.message


def check_file(path: Path, content: bytes) -> Policy | PolicyFileError:
    path.write_bytes(content)
    outcome = load_outcome(path)
    if isinstance(outcome, PolicyFileError):
        assert_names_the_file(outcome, path)
        event(f"PolicyFileError {outcome.message.split(': ')[1][:30]}")
    else:
        event("Policy")
    return outcome


@POLICY_SETTINGS
@given(doc=documents, tables=st.booleans())
def test_structured_document_loads_or_is_refused_naming_the_file(
    policy_dir: Path, doc: dict[str, Any], tables: bool
) -> None:
    check_file(policy_dir / "structured.toml", toml_document(doc, tables).encode())


@POLICY_SETTINGS
@given(text=toml_ish_text)
def test_toml_ish_text_loads_or_is_refused_naming_the_file(policy_dir: Path, text: str) -> None:
    check_file(policy_dir / "text.toml", text.encode("utf-8", "surrogatepass"))


@settings(POLICY_SETTINGS, max_examples=50)
@given(content=st.binary(max_size=200))
def test_arbitrary_bytes_load_or_are_refused_naming_the_file(
    policy_dir: Path, content: bytes
) -> None:
    check_file(policy_dir / "bytes.toml", content)


@pytest.fixture(scope="module")
def store(policy_dir: Path) -> Iterator[PolicyStore]:
    path = write_policy(policy_dir / "live.toml", [grant("bob", ["text.echo"])])
    yield PolicyStore(path)


@POLICY_SETTINGS
@given(
    content=st.one_of(
        st.builds(toml_document, documents, st.booleans()).map(str.encode),
        toml_ish_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
        st.binary(max_size=100),
    )
)
def test_reload_only_ever_swaps_in_a_file_that_loads(store: PolicyStore, content: bytes) -> None:
    before = store.current
    store.path.write_bytes(content)
    expected = load_outcome(store.path)
    error = store.reload()
    if isinstance(expected, Policy):
        assert error is None
        assert store.current.document == expected.document
    else:
        assert isinstance(error, PolicyFileError)
        assert error.message == expected.message
        assert store.current is before


@POLICY_SETTINGS
@given(doc=documents, tables=st.booleans())
def test_a_loaded_policy_renders_back_to_the_same_document(
    policy_dir: Path, doc: dict[str, Any], tables: bool
) -> None:
    loaded = check_file(policy_dir / "roundtrip.toml", toml_document(doc, tables).encode())
    if isinstance(loaded, Policy):
        again = check_file(policy_dir / "rendered.toml", render_policy(loaded.document).encode())
        assert isinstance(again, Policy), again
        assert again.document == loaded.document


def _deeply_nested(depth: int) -> bytes:
    return ("version = 1\nx = " + "[" * depth + "]" * depth + "\n").encode()


def test_deeply_nested_file_is_a_policy_file_error(policy_dir: Path) -> None:
    path = policy_dir / "deep.toml"
    path.write_bytes(_deeply_nested(2000))
    with pytest.raises(PolicyFileError) as info:
        load_policy(path)
    assert_names_the_file(info.value, path)


def test_reload_of_a_deeply_nested_file_keeps_the_old_policy(store: PolicyStore) -> None:
    before = store.current
    store.path.write_bytes(_deeply_nested(2000))
    error = store.reload()
    assert isinstance(error, PolicyFileError)
    assert store.current is before


@pytest.mark.parametrize("entry", ["text.echo@^1,\n1", "text.echo@^1,\x1c1"])
def test_render_policy_output_loads_back(policy_dir: Path, entry: str) -> None:
    path = policy_dir / "render.toml"
    path.write_text(
        '[[grants]]\npeer = "spiffe://e.org/a"\nmax_payload_bytes = 1\n'
        f"expires_at = 2030-01-01T00:00:00Z\ncapabilities = [{toml_string(entry)}]\n"
    )
    loaded = load_policy(path)
    path.write_text(render_policy(loaded.document))
    assert load_policy(path).document == loaded.document


def test_the_toml_renderer_writes_what_tomllib_reads() -> None:
    import tomllib

    doc = {"a": 'x"\\\n\x7f', "b": [1, 2.5, True], "t": {"k": "v"}}
    assert tomllib.loads(toml_document(doc, tables=True)) == doc
