"""Webhook targets (api/webhook_targets.py): loopback, private, link-local/metadata, unspecified and
mapped addresses are refused after resolution; public ones pass. Only the check runs: nothing is
ever sent to any of these addresses. Names are resolved by the system resolver where it answers
locally (IP literals, localhost); a name that resolves to a private address is given a resolver of
its own (no DNS server can be reached from here).

Deliveries connect to the address the check saw: a delivery checked against a public address is
handed to an in-process transport (nothing leaves this machine); real deliveries go to receivers on
127.0.0.1 only, as an operator with HERDFENCE_WEBHOOK_ALLOW_PRIVATE=1 would have."""
from __future__ import annotations

import ipaddress
import socket
import ssl
import subprocess
import threading

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


# --- deliveries go to the address that was checked (no second resolution: DNS rebinding) ----------
NAME = "hooks.example.test"


class _Resolver:
    """A DNS that answers `answers` in turn (the last one from then on) and counts the questions."""

    def __init__(self, *answers: str):
        self.answers, self.asked = list(answers), 0

    def __call__(self, host, port, type=0):  # noqa: A002 - getaddrinfo's keyword
        assert host == NAME, host
        address = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]


def test_pin_aims_at_the_checked_address_and_keeps_the_name_for_host_and_tls():
    from api.webhook_targets import pin
    resolver = _Resolver("93.184.216.34", "127.0.0.1")
    target = pin(f"https://{NAME}/hook?x=1", False, resolve=resolver)
    assert (target.url, target.host, target.server_name) == ("https://93.184.216.34/hook?x=1", NAME, NAME)
    assert target.extensions == {"sni_hostname": NAME} and resolver.asked == 1
    with pytest.raises(TargetRefused, match="loopback"):         # the name now points home: refused
        pin(f"https://{NAME}/hook", False, resolve=resolver)
    plain = pin(f"http://{NAME}:8080/h", False, resolve=_Resolver("93.184.216.34"))
    assert (plain.url, plain.host, plain.server_name) == ("http://93.184.216.34:8080/h", f"{NAME}:8080", None)
    v6 = pin("https://[2606:4700::1111]:8443/h", False)
    assert (v6.url, v6.host, v6.server_name) == ("https://[2606:4700::1111]:8443/h", "[2606:4700::1111]:8443", None)


def _capturing_deliverer(monkeypatch, resolver, seen: list):
    """A Deliverer whose clients hand requests to `seen` instead of the network: the checked address
    here is a public one, and nothing may be sent to it from this machine."""
    import httpx

    from api import webhook_targets
    from api.webhooks import Deliverer
    monkeypatch.setattr(webhook_targets, "system_resolve", resolver)

    def handler(request):
        seen.append(request)
        return httpx.Response(204)
    deliverer = Deliverer(redis=None)
    deliverer.client = deliverer.tls_client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return deliverer


def test_a_delivery_goes_to_the_checked_address_even_when_the_name_is_rebound(monkeypatch):
    import asyncio
    seen: list = []
    resolver = _Resolver("93.184.216.34", "127.0.0.1")      # checked: public; asked again: loopback
    deliverer = _capturing_deliverer(monkeypatch, resolver, seen)
    resp = asyncio.run(deliverer.send(f"https://{NAME}/hook", b"{}", {"x-test": "1"}))
    assert resp.status_code == 204 and resolver.asked == 1
    (request,) = seen
    assert request.url.host == "93.184.216.34" and request.url.path == "/hook"
    assert request.headers["host"] == NAME and request.headers["x-test"] == "1"
    assert request.extensions["sni_hostname"] == NAME
    with pytest.raises(TargetRefused, match="loopback"):      # the next delivery sees the new answer
        asyncio.run(deliverer.send(f"https://{NAME}/hook", b"{}", {}))
    assert len(seen) == 1


class _Receiver:
    """An HTTP(S) receiver on 127.0.0.1 that keeps what it was sent (and the TLS name it was asked for)."""

    def __init__(self, tls: ssl.SSLContext | None = None):
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        got = self.got = []
        self.server_names: list[str | None] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                got.append((self.path, self.headers["host"], self.rfile.read(int(self.headers["content-length"]))))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args):
                pass
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            tls.sni_callback = lambda sock, name, ctx: self.server_names.append(name)
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def no_dns_for_the_name(monkeypatch):
    """The name is known to the target check's resolver only (as 127.0.0.1, the operator allowing
    private receivers); a resolution anywhere else, as on connect, is counted and fails."""
    from api import webhook_targets
    real, later = socket.getaddrinfo, []

    def system(host, *args, **kw):
        name = host.decode() if isinstance(host, bytes) else host      # anyio asks in IDNA bytes
        if name == NAME:
            later.append(name)
        try:
            ipaddress.ip_address(name)
        except ValueError:           # no name goes to a real DNS server from here
            raise socket.gaierror(socket.EAI_NONAME, "not known here") from None
        return real(host, *args, **kw)
    monkeypatch.setattr(socket, "getaddrinfo", system)
    monkeypatch.setattr(webhook_targets, "system_resolve", _Resolver("127.0.0.1"), raising=False)
    return later


def test_a_real_delivery_connects_to_the_checked_address_with_the_name_as_host(no_dns_for_the_name, monkeypatch):
    import asyncio

    from api import webhooks
    failures: list[str] = []          # a failed delivery's record, which goes to Redis in the API
    monkeypatch.setattr(webhooks, "record_failure", lambda _redis, _farm, _hook, reason, _body: failures.append(reason))
    monkeypatch.setattr(webhooks, "RETRY_DELAYS_S", (0.01,))
    receiver = _Receiver()
    try:
        deliverer = webhooks.Deliverer(redis=None, allow_private=True)
        hook = {"id": "wh-1", "url": f"http://{NAME}:{receiver.port}/hook", "secret": "s"}
        asyncio.run(deliverer._post("farm-1", hook, b'{"event_id":"e1"}'))
        assert (failures, no_dns_for_the_name) == ([], [])
        assert receiver.got == [("/hook", f"{NAME}:{receiver.port}", b'{"event_id":"e1"}')]
    finally:
        receiver.close()


def test_tls_is_verified_for_the_name_not_the_address(no_dns_for_the_name, tmp_path):
    """A certificate for the name only (no IP in it): the handshake passes because the name goes as
    SNI and is what the certificate is checked against."""
    import asyncio

    import httpx

    from api.webhooks import Deliverer
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", str(key),
                    "-out", str(cert), "-subj", f"/CN={NAME}", "-addext", f"subjectAltName=DNS:{NAME}"],
                   check=True, capture_output=True)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)
    receiver = _Receiver(server_tls)
    try:
        deliverer = Deliverer(redis=None, allow_private=True)
        deliverer.tls_client = httpx.AsyncClient(verify=ssl.create_default_context(cafile=str(cert)),
                                                 limits=httpx.Limits(max_keepalive_connections=0))
        resp = asyncio.run(deliverer.send(f"https://{NAME}:{receiver.port}/tls", b"{}", {}))
        assert resp.status_code == 204 and receiver.server_names == [NAME]
        assert receiver.got == [("/tls", f"{NAME}:{receiver.port}", b"{}")] and no_dns_for_the_name == []
    finally:
        receiver.close()
