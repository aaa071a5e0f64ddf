"""Where a webhook may point: never at this machine, a private network, link-local addresses (cloud
metadata at 169.254.169.254 among them) or other special ranges — checked on the addresses the host
name resolves to, at registration and again before every delivery (a name may be re-pointed later).
A delivery connects to the very address that was checked (`pin`), the name kept for the Host header
and TLS (SNI and the certificate's name): a name resolved a second time on connect could answer with a
private address (DNS rebinding). Redirects are never followed. An operator whose receivers are
on-premise sets HERDFENCE_WEBHOOK_ALLOW_PRIVATE=1."""
from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass

import httpx

MAX_URL = 2000


class TargetRefused(ValueError):
    pass


class Unresolvable(TargetRefused):
    """The name does not resolve (now): refused at registration, retried at delivery."""


@dataclass(frozen=True)
class Target:
    """Where one delivery goes: `url` with the checked address in place of the name."""
    url: str
    host: str                  # the Host header: the registered name (and its port, when not the default)
    server_name: str | None    # TLS: the name sent as SNI and checked against the certificate

    @property
    def extensions(self) -> dict:
        return {"sni_hostname": self.server_name} if self.server_name else {}


def system_resolve(host: str, port: int, type: int = socket.SOCK_STREAM):  # noqa: A002 - getaddrinfo's
    """The resolver deliveries use (tests replace this one)."""
    return socket.getaddrinfo(host, port, type=type)


def _refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for what, hit in (("a loopback", ip.is_loopback), ("a private", ip.is_private),
                      ("a link-local (cloud metadata)", ip.is_link_local), ("an unspecified", ip.is_unspecified),
                      ("a multicast", ip.is_multicast), ("a reserved", ip.is_reserved)):
        if hit:
            return f"{what} address ({ip})"
    if not ip.is_global:            # shared (carrier-grade NAT), documentation, benchmarking ranges
        return f"a non-public address ({ip})"
    return None


def _parse(url: object) -> tuple[httpx.URL, str, int]:
    """The URL as httpx will send it, its host name (ASCII) and port. One parser for the check and the
    connection: two parsers can read a different host out of the same crafted URL."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise TargetRefused(f"url must be a string of at most {MAX_URL} characters")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, UnicodeError, ValueError):
        raise TargetRefused("url must be an absolute http:// or https:// URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.raw_host:
        raise TargetRefused("url must be an absolute http:// or https:// URL")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    if not 0 < port < 65536:
        raise TargetRefused("url has an invalid port")
    return parsed, parsed.raw_host.decode("ascii"), port


def _addresses(host: str, port: int, resolve) -> list[str]:
    try:
        infos = (resolve or system_resolve)(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        infos = []
    addresses = [info[4][0].split("%", 1)[0] for info in infos]
    if not addresses:
        raise Unresolvable(f"url host {host!r} does not resolve")
    return addresses


def _refuse_any(host: str, addresses: list[str]) -> None:
    for address in addresses:
        reason = _refusal(ipaddress.ip_address(address))
        if reason:
            raise TargetRefused(f"url host {host!r} resolves to {reason}: webhooks go to public "
                                "addresses only (an operator may set HERDFENCE_WEBHOOK_ALLOW_PRIVATE=1)")


def check(url: object, allow_private: bool, resolve=None) -> str:
    """The URL when a webhook may be delivered there; TargetRefused naming the reason otherwise."""
    _, host, port = _parse(url)
    if not allow_private:
        _refuse_any(host, _addresses(host, port, resolve))
    return url  # type: ignore[return-value] - _parse took only a str


def pin(url: object, allow_private: bool, resolve=None) -> Target:
    """Resolve the URL's host once, check every address, and aim the delivery at the first of them."""
    parsed, host, port = _parse(url)
    addresses = _addresses(host, port, resolve)
    if not allow_private:
        _refuse_any(host, addresses)
    return Target(url=str(parsed.copy_with(host=addresses[0])), host=parsed.netloc.decode("ascii"),
                  server_name=host if parsed.scheme == "https" and not _is_literal(host) else None)


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
