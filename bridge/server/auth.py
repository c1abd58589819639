"""Bearer API keys: the key file, constant-time checks, the middleware and SIGHUP reload."""

from __future__ import annotations

import asyncio
import hmac
import logging
import signal
from pathlib import Path
from typing import Awaitable, Callable

from aiohttp import hdrs, web

from ...head.errors import Category, ClefError
from .body import BadHeader, header
from .routes import PUBLIC  # with auth on, only these answer without a key; none names a model

log = logging.getLogger("clef_bridge.auth")

CHALLENGE = 'Bearer realm="clef-bridge"'  # the WWW-Authenticate of every 401 (RFC 9110 section 11.6.1)


class Unauthorized(ClefError):
    category = Category.UNAUTHORIZED
    error_type = "authentication_error"


class ApiKeysError(ClefError):
    """The api_keys_file cannot be read or holds no key."""

    category = Category.CONFIG
    error_type = "api_keys_error"


class ApiKeys:
    """Bearer keys from a file, one per line (# comments allowed); reloadable."""

    def __init__(self, path: Path | None):
        self.path = path
        self.keys: tuple[bytes, ...] = ()
        self.reload()

    @property
    def enabled(self) -> bool:
        return self.path is not None

    def reload(self) -> None:
        if self.path is None:
            return
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ApiKeysError(f"api_keys_file {self.path}: cannot read: {exc}") from None
        keys = tuple(k.strip().encode() for k in lines if k.strip() and not k.strip().startswith("#"))
        if not keys:
            raise ApiKeysError(f"{self.path}: no API keys in the file; add one per line or remove api_keys_file")
        self.keys = keys

    def check(self, authorization: str | None) -> None:
        if not self.enabled:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():  # the scheme is case-insensitive (RFC 9110 11.1)
            raise Unauthorized("missing API key: send Authorization: Bearer YOUR_KEY")
        given = token.strip().encode()
        ok = False
        for key in self.keys:  # compare with every key, in constant time each
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise Unauthorized("invalid API key")


def auth_middleware(keys_key: web.AppKey) -> Callable:
    """Middleware checking every non-public route against the ApiKeys stored under keys_key."""
    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        keys = request.app[keys_key]
        if keys.enabled and request.path not in PUBLIC:
            try:
                authorization = header(request, hdrs.AUTHORIZATION)
            except BadHeader:
                raise Unauthorized("invalid API key: the Authorization header is not valid UTF-8") from None
            keys.check(authorization)
        return await handler(request)
    return middleware


def install_sighup(keys: ApiKeys) -> None:
    """Reload the keys on SIGHUP (where the platform and thread allow signal handlers)."""
    if not keys.enabled:
        return

    def reload() -> None:
        try:
            keys.reload()
            log.info("reloaded %d API keys from %s", len(keys.keys), keys.path)
        except (OSError, ClefError) as exc:
            log.error("keeping the old API keys: %s", exc)

    try:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread (tests) or no SIGHUP
        log.debug("SIGHUP key reload is not available in this thread")
