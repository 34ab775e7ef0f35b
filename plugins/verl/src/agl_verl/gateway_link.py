"""Point agl's gateway at verl's rollout servers, from inside verl's agent-loop workers.

verl starts its vLLM servers on ports the OS picks (uvicorn on port 0) and keeps their
addresses (``host:port``) in its global load balancer, a Ray actor every agent loop reaches
through its ``server_manager``. :class:`GatewayLink` reads those addresses and, when they
differ from what it registered last (the first rollout, or after servers were added,
removed or restarted), replaces the gateway's upstreams with them through the gateway's
admin route (``POST /admin/upstreams``). The agents' calls, which go through the gateway,
then land on the servers whose weights verl is training.
"""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from agl.env import GATEWAY_ADMIN_TOKEN
from agl.errors import AglError

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
"""No proxy from the environment: the gateway is reached directly."""


class GatewayLinkError(AglError, RuntimeError):
    """The gateway could not be told where verl's rollout servers are."""


def server_urls(addresses: Sequence[str]) -> list[str]:
    """verl's server addresses (``host:port``, IPv6 hosts bracketed or not) as the gateway's upstream URLs."""
    urls = []
    for address in addresses:
        address = str(address).strip()
        if not address:
            raise GatewayLinkError("verl listed an empty rollout server address")
        if "://" in address:
            base = address.rstrip("/")
        else:
            host, _, port = address.rpartition(":")
            if ":" in host and not host.startswith("["):
                host = f"[{host}]"  # an IPv6 address
            base = f"http://{host}:{port}"
        urls.append(base if base.endswith("/v1") else base + "/v1")
    return sorted(urls)


async def verl_server_addresses(server_manager: Any) -> list[str]:
    """The addresses verl's load balancer holds now (``LLMServerClient._load_balancer.get_all_servers``)."""
    balancer = getattr(server_manager, "_load_balancer", None)
    if balancer is None:
        raise GatewayLinkError(
            "the agent loop's server_manager has no load balancer: verl 0.9's LLMServerClient keeps the rollout "
            "servers' addresses there, and agl needs them to point its gateway at the weights being trained"
        )
    return list(await balancer.get_all_servers.remote())


class GatewayLink:
    """Registers verl's rollout servers as the gateway's upstreams, once per change.

    ``gateway_url`` is the gateway's root (``http://host:port``); the admin token is
    ``admin_token``, else ``$AGL_GATEWAY_ADMIN_TOKEN``. Thread-safe: verl's agent loops of one
    worker share one link.
    """

    def __init__(self, gateway_url: str, *, admin_token: str | None = None, timeout_s: float = 10.0):
        self.gateway_url = gateway_url.rstrip("/")
        self.admin_token = admin_token or GATEWAY_ADMIN_TOKEN.get()
        if not self.admin_token:
            raise GatewayLinkError(
                f"{GATEWAY_ADMIN_TOKEN} is unset in this verl worker: the agent loop needs the gateway's admin "
                "token to register verl's rollout servers (agl train sets it in Ray's runtime environment)"
            )
        self.timeout_s = timeout_s
        self.registered: list[str] = []
        self._lock = threading.Lock()

    def register(self, addresses: Sequence[str]) -> bool:
        """Make ``addresses`` the gateway's upstreams unless they are already; True when it posted."""
        urls = server_urls(addresses)
        if not urls:
            raise GatewayLinkError("verl's load balancer lists no rollout server: nothing to send the agents to")
        with self._lock:
            if urls == self.registered:
                return False
            answer = self._post("/admin/upstreams", {"upstreams": urls})
            if sorted(answer.get("upstreams") or []) != urls:
                raise GatewayLinkError(f"the gateway took {answer.get('upstreams')} for upstreams, not {urls}")
            self.registered = urls
            return True

    async def sync(self, server_manager: Any) -> bool:
        """Read verl's current server addresses and register them (see :meth:`register`)."""
        addresses = await verl_server_addresses(server_manager)
        return await asyncio.to_thread(self.register, addresses)

    def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            self.gateway_url + path,
            data=json.dumps(payload).encode(),
            headers={"Authorization": f"Bearer {self.admin_token}", "Content-Type": "application/json"},
            method="POST",
        )
        try:
            with _DIRECT.open(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode("utf-8", "replace")
            raise GatewayLinkError(f"gateway {self.gateway_url}{path} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise GatewayLinkError(f"cannot reach the gateway at {self.gateway_url}: {exc}") from None
