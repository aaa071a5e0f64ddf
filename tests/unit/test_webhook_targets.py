"""Webhook targets (api/webhook_targets.py): loopback, private, link-local/metadata, unspecified and
mapped addresses are refused after resolution; public ones pass. Only the check runs: nothing is
ever sent to any of these addresses. Names are resolved by the system resolver where it answers
locally (IP literals, localhost); a name that resolves to a private address is given a resolver of
its own (no DNS server can be reached from here)."""
from __future__ import annotations

import socket

import pytest

from api.webhook_targets import TargetRefused, check

REFUSED = ["http://127.0.0.1:7101/", "http://localhost/hook", "http://10.0.0.5/x", "http://172.16.3.4/",
           "http://192.168.1.10/", "http://169.254.169.254/latest/meta-data/", "http://0.0.0.0:80/",
           "http://[::1]/", "http://[::ffff:127.0.0.1]/", "http://[fe80::1]/", "https://100.64.0.1/"]


@pytest.mark.parametrize("url", REFUSED)
def test_private_targets_are_refused(url):
    with pytest.raises(TargetRefused, match="address"):
        check(url, allow_private=False)


def test_public_targets_pass_and_the_operator_may_allow_private():
    assert check("https://93.184.216.34/hook", allow_private=False) == "https://93.184.216.34/hook"
    assert check("http://127.0.0.1:9/hook", allow_private=True) == "http://127.0.0.1:9/hook"


def test_a_name_that_resolves_to_a_private_address_is_refused():
    def resolver(host, port, type=0):  # noqa: A002 - getaddrinfo's keyword
        addr = {"hooks.example.org": "93.184.216.34", "rebound.example.org": "10.1.2.3"}[host]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (addr, port))]
    assert check("https://hooks.example.org/x", False, resolve=resolver)
    with pytest.raises(TargetRefused, match="private"):
        check("https://rebound.example.org/x", False, resolve=resolver)


@pytest.mark.parametrize("url", [None, 42, "ftp://example.org/", "http:///nohost", "http://example.org:99999/",
                                 "https://" + "a" * 3000 + ".org/"])
def test_malformed_urls_are_refused(url):
    with pytest.raises(TargetRefused):
        check(url, allow_private=False)
