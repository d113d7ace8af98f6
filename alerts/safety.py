"""Where a webhook may point. A URL whose host resolves to a loopback, private, link-local,
reserved or multicast address is refused (the platform must not be a way into its own
network), unless its host is in ``GPUMARKET_WEBHOOK_ALLOWED_HOSTS``, which only an
operator sets. Checked when the webhook is saved and again before every delivery, since a
name can resolve elsewhere later."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from django.conf import settings

from alerts.errors import AlertError


def webhook_url_check(url: str) -> str:
    """``url`` if a webhook may be sent there; AlertError naming the reason otherwise."""
    parts = urlsplit(url.strip())
    if parts.scheme not in {"http", "https"}:
        raise AlertError(f"url: a webhook must be http or https, not {parts.scheme or 'empty'!r}")
    host = parts.hostname
    if not host:
        raise AlertError("url: the webhook's address has no host")
    if parts.username or parts.password:
        raise AlertError("url: put no user name or password in the webhook's address")
    allowed = {h.strip().lower() for h in settings.GPUMARKET_WEBHOOK_ALLOWED_HOSTS if h.strip()}
    if host.lower() in allowed:
        return url.strip()
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise AlertError(f"url: {exc}") from None
    try:
        infos = socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise AlertError(f"url: the host {host!r} does not resolve ({exc.strerror})") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not address.is_global or address.is_multicast:
            raise AlertError(
                f"url: {host} resolves to {address}, a loopback, private or reserved address; "
                "webhooks go to public addresses unless an operator allows the host "
                "(GPUMARKET_WEBHOOK_ALLOWED_HOSTS)"
            )
    return url.strip()
