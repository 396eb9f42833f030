"""A kmock Kubernetes API emulator on a real HTTP port, and an executor pointed at it.

kmock is asyncio; the official client is synchronous. The emulator runs on its own event loop
in a background thread, so the executor talks plain HTTP to it exactly as to an API server.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import kmock
import pytest
from kubernetes import client

from apps.clusters.executors.kubernetes import KubernetesExecutor
from tests.executors_k8s.emulation import CLUSTER_RESOURCES, RESOURCES, ApiServerEmulator


@pytest.fixture
def emulator() -> Iterator[ApiServerEmulator]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="kmock", daemon=True)
    thread.start()

    async def start() -> tuple[ApiServerEmulator, kmock.Server]:
        handler = ApiServerEmulator()
        for resource, kind in RESOURCES.items():
            handler.resources[resource] = {"kind": kind, "namespaced": True}
        for resource, kind in CLUSTER_RESOURCES.items():
            handler.resources[resource] = {"kind": kind, "namespaced": False}
        await handler.__aenter__()
        server = kmock.Server(handler)
        await server.__aenter__()
        return handler, server

    handler, server = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=10)

    async def stop() -> None:
        await server.__aexit__(None, None, None)
        await handler.__aexit__(None, None, None)

    try:
        yield handler
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def api_client(emulator: ApiServerEmulator) -> Iterator[client.ApiClient]:
    configuration = client.Configuration()
    configuration.host = str(emulator.url).rstrip("/")
    with client.ApiClient(configuration) as api:
        yield api


@pytest.fixture
def executor(api_client: client.ApiClient) -> KubernetesExecutor:
    return KubernetesExecutor(
        api_client, namespace="gpu-jobs", ingress_domain="apps.example.org", ingress_class="nginx"
    )
