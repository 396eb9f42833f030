"""The channel layer works on both Redis the portal runs with: the server of REDIS_URL and the embedded one."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

from channels_redis.core import RedisChannelLayer

from hcsportal.management.commands.runportal import start_embedded_redis
from hcsportal.settings import channel_layer_host


def _round_trip(address: str) -> dict:
    async def go():
        layer = RedisChannelLayer(hosts=[channel_layer_host(address)])
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "live.message", "text": "hello"})
        message = await asyncio.wait_for(layer.receive(channel), 5)
        await layer.flush()
        await layer.close_pools()
        return message

    return asyncio.run(go())


def test_the_embedded_unix_socket_redis_carries_live_messages():
    # `make run` without REDIS_URL: every live socket failed with a TypeError (socket_keepalive on a unix socket).
    workdir = Path(tempfile.mkdtemp(prefix="hcs-layer-"))
    proc = start_embedded_redis(workdir / "redis.sock", workdir)
    try:
        assert _round_trip(f"unix://{workdir / 'redis.sock'}")["text"] == "hello"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_tcp_redis_keeps_its_keepalive(settings):
    assert channel_layer_host("redis://127.0.0.1:6379/0")["socket_keepalive"] is True
    assert "socket_keepalive" not in channel_layer_host("unix:///run/redis.sock")
    if settings.REDIS_URL.startswith("redis://"):
        assert _round_trip(settings.REDIS_URL)["text"] == "hello"
