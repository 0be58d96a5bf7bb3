"""What a webhook URL may be, which hosts a grant names, and which addresses may be reached."""

from __future__ import annotations

import ipaddress

import pytest
from pydantic import ValidationError

from gateway.errors import PushUrlRefused
from gateway.push.addresses import AddressClass, address_class, address_refusal, named_addresses
from gateway.push.webhook_url import check_granted, host_allowed, parse_webhook_url
from policies.grants import PeerGrant, push_host_entry


@pytest.mark.parametrize(
    ("url", "host", "port", "target", "authority"),
    [
        (
            "https://hooks.example.com/a?b=c",
            "hooks.example.com",
            443,
            "/a?b=c",
            "hooks.example.com",
        ),
        (
            "HTTPS://Hooks.Example.COM:8443",
            "hooks.example.com",
            8443,
            "/",
            "hooks.example.com:8443",
        ),
        ("https://10.0.0.7/x", "10.0.0.7", 443, "/x", "10.0.0.7"),
        ("https://[::1]:9/x", "::1", 9, "/x", "[::1]:9"),
        ("https://localhost/", "localhost", 443, "/", "localhost"),
    ],
)
def test_webhook_urls_that_parse(
    url: str, host: str, port: int, target: str, authority: str
) -> None:
    parsed = parse_webhook_url(url)
    assert (parsed.host, parsed.port, parsed.target, parsed.authority) == (
        host,
        port,
        target,
        authority,
    )
    assert parsed.url == url


@pytest.mark.parametrize(
    "url",
    [
        "",
        "http://hooks.example.com/",
        "ftp://hooks.example.com/",
        "//hooks.example.com/",
        "https://user@hooks.example.com/",
        "https://user:pw@hooks.example.com/",
        "https://hooks.example.com@evil.test/",
        "https://evil.test\\@hooks.example.com/",
        "https://hooks.example.com/#frag",
        "https://hooks.example.com/#",
        "https://hooks%2eexample.com/",
        "https://hooks.example.com:0/",
        "https://hooks.example.com:65536/",
        "https://hooks.example.com:x/",
        "https://127.1/",
        "https://2130706433/",
        "https://0177.0.0.1/",
        "https://0x7f.0.0.1/",
        "https://[fe80::1%25eth0]/",
        "https://[not-an-ip]/",
        "https://exa mple.com/",
        "https://exämple.com/",
        "https://hooks.example.com./",
        "https://under_score.example.com/",
        "https:///nohost",
        "https://hooks.example.com/\x00",
        "https://hooks.example.com/" + "a" * 2048,
    ],
)
def test_webhook_urls_that_are_refused(url: str) -> None:
    with pytest.raises(PushUrlRefused):
        parse_webhook_url(url)


def test_push_hosts_entries_have_one_spelling() -> None:
    assert push_host_entry("Hooks.Example.COM") == "hooks.example.com"
    assert push_host_entry("*.Example.com") == "*.example.com"
    assert push_host_entry("::ffff:127.0.0.1") == "127.0.0.1"
    assert push_host_entry("0:0:0::1") == "::1"
    for bad in (
        "*",
        "*.com",
        "a..b",
        "x.com.",
        "1.2.3.4:80",
        "10.0.0.0/8",
        "127.1",
        "fe80::1%eth0",
        "https://x.com",
        "*.*.x.com",
        "x*.com",
        "",
    ):
        with pytest.raises(ValueError):
            push_host_entry(bad)
    with pytest.raises(ValidationError):
        PeerGrant.model_validate(
            {
                "peer": "spiffe://example.org/agent/bob",
                "capabilities": [],
                "max_payload_bytes": 1,
                "expires_at": "2030-01-01T00:00:00Z",
                "push_hosts": ["a.example", "A.example"],
            }
        )


def test_hosts_a_grant_names() -> None:
    hosts = ("hooks.example.com", "*.corp.example", "10.0.0.7")
    assert host_allowed("hooks.example.com", hosts)
    assert not host_allowed("evil.hooks.example.com", hosts)  # a name names itself only
    assert host_allowed("a.corp.example", hosts) and host_allowed("a.b.corp.example", hosts)
    assert not host_allowed("corp.example", hosts)
    assert not host_allowed("evilcorp.example", hosts)
    assert host_allowed("10.0.0.7", hosts) and not host_allowed("10.0.0.8", hosts)


def test_an_ip_host_is_checked_when_the_config_is_made() -> None:
    check_granted(parse_webhook_url("https://10.0.0.7/"), ("10.0.0.7",))  # named: fine
    with pytest.raises(PushUrlRefused):
        check_granted(parse_webhook_url("https://10.0.0.8/"), ("10.0.0.7",))
    with pytest.raises(PushUrlRefused):  # never a webhook, even named
        check_granted(parse_webhook_url("https://0.0.0.0/"), ("0.0.0.0",))


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("93.184.216.34", AddressClass.PUBLIC),
        ("2606:2800:220:1:248:1893:25c8:1946", AddressClass.PUBLIC),
        ("127.0.0.1", AddressClass.LOOPBACK),
        ("127.255.0.9", AddressClass.LOOPBACK),
        ("::1", AddressClass.LOOPBACK),
        ("10.0.0.1", AddressClass.PRIVATE),
        ("172.16.5.4", AddressClass.PRIVATE),
        ("192.168.1.1", AddressClass.PRIVATE),
        ("169.254.1.1", AddressClass.LINK_LOCAL),
        ("fe80::1", AddressClass.LINK_LOCAL),
        ("169.254.169.254", AddressClass.METADATA),
        ("fd00:ec2::254", AddressClass.METADATA),
        ("100.100.100.200", AddressClass.METADATA),
        ("100.64.0.1", AddressClass.SHARED),
        ("100.127.255.254", AddressClass.SHARED),
        ("fd12:3456::1", AddressClass.UNIQUE_LOCAL),
        ("192.0.2.1", AddressClass.PRIVATE),  # documentation
        ("198.18.0.1", AddressClass.PRIVATE),  # benchmarking
        ("240.0.0.1", AddressClass.PRIVATE),  # reserved
        ("0.0.0.0", AddressClass.UNSPECIFIED),
        ("0.1.2.3", AddressClass.UNSPECIFIED),
        ("::", AddressClass.UNSPECIFIED),
        ("224.0.0.1", AddressClass.MULTICAST),
        ("ff02::1", AddressClass.MULTICAST),
        ("255.255.255.255", AddressClass.BROADCAST),
        ("::ffff:127.0.0.1", AddressClass.LOOPBACK),
        ("::ffff:169.254.169.254", AddressClass.METADATA),
        ("64:ff9b::a00:1", AddressClass.PRIVATE),
        ("2002:7f00:1::", AddressClass.LOOPBACK),  # 6to4 of 127.0.0.1
    ],
)
def test_address_classes(address: str, kind: AddressClass) -> None:
    assert address_class(ipaddress.ip_address(address)) is kind


def test_a_named_address_is_allowed_but_never_the_unusable_ones() -> None:
    named = named_addresses(["hooks.example.com", "127.0.0.1", "0.0.0.0", "224.0.0.1"])
    assert named == {ipaddress.ip_address(a) for a in ("127.0.0.1", "0.0.0.0", "224.0.0.1")}
    loopback = ipaddress.ip_address("127.0.0.1")
    assert address_refusal(loopback, named) is None
    assert address_refusal(ipaddress.ip_address("::ffff:127.0.0.1"), named) is None
    assert address_refusal(ipaddress.ip_address("127.0.0.2"), named) is AddressClass.LOOPBACK
    assert address_refusal(ipaddress.ip_address("0.0.0.0"), named) is AddressClass.UNSPECIFIED
    assert address_refusal(ipaddress.ip_address("224.0.0.1"), named) is AddressClass.MULTICAST
    assert address_refusal(ipaddress.ip_address("93.184.216.34"), frozenset()) is None
