"""``metrics_bind``: ``GET /metrics`` (and ``/healthz``) on an address of its own, no token.

For a Prometheus that scrapes another interface than the REST API's, or an agent
without the REST API.  The REST API serves the same ``/metrics`` when it runs.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from certagent.config import parse_bind
from certagent.errors import ConfigError

from .views import METRICS_TYPE

__all__ = ["MetricsServer", "start_metrics"]

log = logging.getLogger(__name__)


class MetricsServer:
    def __init__(self, runner: web.AppRunner, url: str) -> None:
        self._runner = runner
        self.url = url

    async def close(self) -> None:
        await self._runner.cleanup()


async def start_metrics(bind: str, metrics: Callable[[], Awaitable[bytes]]) -> MetricsServer:
    """Serve ``/metrics`` on ``bind`` (host:port); ConfigError if it cannot be bound."""

    async def scrape(request: web.Request) -> web.Response:
        response = web.Response(body=await metrics())
        response.headers["Content-Type"] = METRICS_TYPE
        return response

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    host, port = parse_bind(bind)
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        raise ConfigError(f"cannot serve metrics on {bind}: {exc.strerror}") from exc
    bound = runner.addresses[0]
    url = f"http://{bound[0]}:{bound[1]}/metrics"
    log.info("metrics on %s", url)
    return MetricsServer(runner, url)
