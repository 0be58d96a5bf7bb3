"""One delivery attempt: resolve once, check, connect to that address, POST, judge the answer.

The attempt never lets the HTTP client choose where it connects:

1. an IP host is used as is; a name is resolved once (:mod:`gateway.push.resolver`)
   and every address of the answer must pass :func:`~gateway.push.addresses.address_refusal`
   (one refused address refuses the attempt: a name that mixes a public and a
   private address is not trusted with either);
2. the request goes to ``https://ADDRESS:PORT/PATH``, with the name as TLS
   server name (SNI) and ``Host`` header, and the receiver's certificate is
   verified for the name (:func:`webhook_tls`: the system's CAs and/or
   ``[push] ca``; verification is never off);
3. no proxy from the environment, no redirect (a 3xx fails the attempt and is
   not retried), no connection kept (a connection is never reused for another
   name that has the same address), nothing of the answer read but its
   status, and the whole attempt bounded by ``[push] timeout``.

What came of it is an :class:`Attempt`: a reason code for the audit record,
whether it was refused (never sent) and whether another attempt may help.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping
from dataclasses import dataclass

import httpx

from gateway.config.push import PushSettings
from gateway.push.addresses import IPAddress, address_refusal, named_addresses
from gateway.push.resolver import Resolver, parsed_addresses, system_resolver
from gateway.push.webhook_url import WebhookUrl, host_allowed

OK = "OK"
HOST_NOT_ALLOWED = "PUSH_HOST_NOT_ALLOWED"
ADDRESS_REFUSED = "PUSH_ADDRESS_REFUSED"
DNS_FAILED = "PUSH_DNS_FAILED"
CONNECT_FAILED = "PUSH_CONNECT_FAILED"
TLS_FAILED = "PUSH_TLS_FAILED"
TIMEOUT = "PUSH_TIMEOUT"
REDIRECT_REFUSED = "PUSH_REDIRECT_REFUSED"
HTTP_STATUS = "PUSH_HTTP_STATUS"
_RETRIED_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
MEDIA_TYPE = "application/a2a+json"


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one delivery attempt came to.

    Attributes:
        reason: ``OK`` or a ``PUSH_*`` reason code.
        refused: The policy refused it: nothing was sent (decision ``refuse``).
        retry: Another attempt may succeed (a timeout, a 503; not a 404 or a redirect).
        status: The receiver's HTTP status (0 if none came).
        address: The address connected to (or refused), "" if none.
        note: What else the audit detail says (an address class, an error's kind).
    """

    reason: str
    refused: bool = False
    retry: bool = False
    status: int = 0
    address: str = ""
    note: str = ""


def webhook_tls(settings: PushSettings) -> ssl.SSLContext:
    """The TLS client context of deliveries: TLS 1.2+, the certificate verified for the name.

    Raises:
        OSError: ``[push] ca`` cannot be read.
        ssl.SSLError: it holds no usable certificate.
    """
    context = (
        ssl.create_default_context()
        if settings.system_roots
        else ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = True
    context.verify_mode = ssl.CERT_REQUIRED
    if settings.ca is not None:
        context.load_verify_locations(cafile=str(settings.ca))
    return context


class WebhookSender:
    """Makes delivery attempts over one HTTP client (see the module doc).

    Args:
        settings: Timeouts and trust (``[push]``).
        resolver: Looks names up (tests pass their own).
        tls: The client TLS context (default: :func:`webhook_tls` of ``settings``).
    """

    def __init__(
        self,
        settings: PushSettings,
        resolver: Resolver = system_resolver,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self._settings = settings
        self.resolver = resolver
        self._tls = tls
        self._http: httpx.AsyncClient | None = None

    def open(self) -> None:
        """Build the TLS context and the HTTP client (reads ``[push] ca``).

        Raises:
            OSError: ``[push] ca`` cannot be read.
            ssl.SSLError: it holds no usable certificate.
        """
        settings = self._settings
        self._http = httpx.AsyncClient(
            verify=self._tls if self._tls is not None else webhook_tls(settings),
            trust_env=False,
            follow_redirects=False,
            http2=False,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=0),
            timeout=httpx.Timeout(settings.timeout, connect=settings.connect_timeout),
        )

    @property
    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("WebhookSender.open() was not called")
        return self._http

    async def close(self) -> None:
        """Close the HTTP client (no attempt is under way any more)."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def attempt(
        self,
        url: WebhookUrl,
        push_hosts: tuple[str, ...],
        headers: Mapping[str, str],
        body: bytes,
    ) -> Attempt:
        """Deliver ``body`` to ``url`` once, as the grant's ``push_hosts`` allow now."""
        if not host_allowed(url.host, push_hosts):
            return Attempt(HOST_NOT_ALLOWED, refused=True)
        try:
            async with asyncio.timeout(self._settings.timeout):
                return await self._attempt(url, push_hosts, headers, body)
        except TimeoutError:
            return Attempt(TIMEOUT, retry=True, note="the attempt took too long")

    async def _attempt(
        self,
        url: WebhookUrl,
        push_hosts: tuple[str, ...],
        headers: Mapping[str, str],
        body: bytes,
    ) -> Attempt:
        if url.literal is not None:
            addresses: list[IPAddress] = [url.literal]
        else:
            try:
                async with asyncio.timeout(self._settings.connect_timeout):
                    answer = await self.resolver(url.host, url.port)
                addresses = parsed_addresses(answer)
            except (OSError, TimeoutError) as err:
                return Attempt(DNS_FAILED, retry=True, note=type(err).__name__)
        named = named_addresses(push_hosts)
        for address in addresses:
            refusal = address_refusal(address, named)
            if refusal is not None:
                return Attempt(
                    ADDRESS_REFUSED, refused=True, address=str(address), note=refusal.value
                )
        return await self._post(url, addresses[0], headers, body)

    async def _post(
        self, url: WebhookUrl, address: IPAddress, headers: Mapping[str, str], body: bytes
    ) -> Attempt:
        shown = f"[{address}]" if address.version == 6 else str(address)
        request = self._client.build_request(
            "POST",
            f"https://{shown}:{url.port}{url.target}",
            headers={**headers, "Host": url.authority, "Content-Type": MEDIA_TYPE},
            content=body,
            # The certificate is checked for the name; an IP host is checked as itself.
            extensions={} if url.literal is not None else {"sni_hostname": url.host},
        )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TimeoutException as err:
            return Attempt(TIMEOUT, retry=True, address=str(address), note=type(err).__name__)
        except httpx.TransportError as err:
            reason = TLS_FAILED if _tls_failure(err) else CONNECT_FAILED
            return Attempt(reason, retry=True, address=str(address), note=type(err).__name__)
        await response.aclose()  # nothing of the body is read
        return _judged(response.status_code, str(address))


def _judged(status: int, address: str) -> Attempt:
    if 200 <= status < 300:
        return Attempt(OK, status=status, address=address)
    if 300 <= status < 400:
        return Attempt(REDIRECT_REFUSED, status=status, address=address)
    return Attempt(HTTP_STATUS, retry=status in _RETRIED_STATUSES, status=status, address=address)


def _tls_failure(err: BaseException) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "SSL" in str(err) or "certificate" in str(err).lower()
