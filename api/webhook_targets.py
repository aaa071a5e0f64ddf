"""Where a webhook may point: never at this machine, a private network, link-local addresses (cloud
metadata at 169.254.169.254 among them) or other special ranges — checked on the addresses the host
name resolves to, at registration and again before every delivery (a name may be re-pointed later).
Redirects are never followed. An operator whose receivers are on-premise sets
HERDFENCE_WEBHOOK_ALLOW_PRIVATE=1."""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlparse

MAX_URL = 2000


class TargetRefused(ValueError):
    pass


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


def check(url: object, allow_private: bool, resolve=socket.getaddrinfo) -> str:
    """The URL when a webhook may be delivered there; TargetRefused naming the reason otherwise."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        raise TargetRefused(f"url must be a string of at most {MAX_URL} characters")
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise TargetRefused("url must be an absolute http:// or https:// URL")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        raise TargetRefused("url has an invalid port") from None
    if allow_private:
        return url
    try:
        infos = resolve(parsed.hostname, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        raise TargetRefused(f"url host {parsed.hostname!r} does not resolve") from None
    for info in infos:
        reason = _refusal(ipaddress.ip_address(info[4][0].split("%", 1)[0]))
        if reason:
            raise TargetRefused(f"url host {parsed.hostname!r} resolves to {reason}: webhooks go to public "
                                "addresses only (an operator may set HERDFENCE_WEBHOOK_ALLOW_PRIVATE=1)")
    return url
