"""Admission webhook latency: 1,000 AdmissionReviews over HTTPS on loopback, p50 / p99
(docs/rules.md#performance-targets: p99 < 50 ms).

Starts the portal as the webhook Deployment runs it (``uvicorn hcsportal.asgi:application`` with a TLS listener,
one worker) on a free loopback port, with a certificate made here, and posts real AdmissionReview v1 requests with
a cluster's webhook token, cycling through four pods: one asking for cards by annotation (patched), the same pod
already injected (no patch), one requesting a vendor resource itself (patched), and one outside the enrolled
namespaces (no patch). Each review is timed from send to parsed answer, as the API server waits for it: once over a
kept-alive connection (what the API server does) and once with a new TLS connection per review.

    python -m benchmarks.webhook_latency [--reviews 1000]

The database is the embedded SQLite in a fresh directory, or, with DATABASE_URL=postgres://..., a database
hcs_bench_webhook on that server (created, then dropped). Client, server and database share the machine.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import json
import logging
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse, urlunparse

from benchmarks.table import print_table

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
DATABASE = "hcs_bench_webhook"
TARGET_P99_MS = 50.0
ENROLLED = "team-a"


def _tls(directory: Path) -> tuple[str, str, str]:
    """A CA and a server certificate for 127.0.0.1 signed by it: (CA file, certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hcs-bench-ca")])

    def builder(subject, public_key):
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_name)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    ca = builder(ca_name, ca_key.public_key()).add_extension(x509.BasicConstraints(ca=True, path_length=0), True)
    ca = ca.sign(ca_key, hashes.SHA256())
    server_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hcs-bench")])
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST))])
    cert = builder(server_name, key.public_key()).add_extension(san, False).sign(ca_key, hashes.SHA256())
    files = (directory / "ca.pem", directory / "tls.crt", directory / "tls.key")
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    files[2].write_bytes(pem)
    return tuple(str(f) for f in files)


def _database_env(state_dir: Path) -> tuple[dict, str | None]:
    """Environment of the server and this process: PostgreSQL when DATABASE_URL says so, else embedded SQLite."""
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{DATABASE}"')
        return {"DATABASE_URL": urlunparse(urlparse(url)._replace(path=f"/{DATABASE}"))}, url
    return {"HCS_VAR_DIR": str(state_dir)}, None


def _seed() -> str:
    """A VDC and a Kubernetes cluster that enrols ENROLLED; returns its webhook token."""
    from django.core.management import call_command

    from apps.clusters.models import Cluster
    from apps.clusters.webhook import issue_webhook_token
    from apps.vdc.models import VDC

    call_command("migrate", verbosity=0)
    vdc = VDC.objects.create(name="bench", is_default=True)
    cluster = Cluster.objects.create(
        vdc=vdc,
        name="k8s",
        cluster_type="kubernetes",
        endpoint="https://10.0.0.10:6443",
        webhook_namespaces=[ENROLLED],
        labels={"runtime-class-nvidia": "nvidia"},
    )
    return issue_webhook_token(cluster)


def _pod(annotations: dict | None = None, limits: dict | None = None) -> dict:
    main: dict = {"name": "train", "image": "pytorch/pytorch:2.4.0", "command": ["python", "train.py"]}
    if limits:
        main["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "train-1", "labels": {"app": "train"}, "annotations": annotations or {}},
        "spec": {"containers": [main, {"name": "logs", "image": "busybox:1.36"}], "restartPolicy": "Never"},
    }


def _review(pod: dict, namespace: str = ENROLLED) -> dict:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": pod,
            "dryRun": False,
        },
    }


def _start_server(env: dict, cert: str, key: str) -> tuple[subprocess.Popen, int]:
    with socket.socket() as s:
        s.bind((HOST, 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "hcsportal.asgi:application",
        "--host",
        HOST,
        "--port",
        str(port),
        "--ssl-certfile",
        cert,
        "--ssl-keyfile",
        key,
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    server = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **env})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"the webhook listener exited with {server.returncode}")
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return server, port
        except OSError:
            time.sleep(0.1)
    server.terminate()
    sys.exit("the webhook listener did not start within 60 s")


def _measure(base: str, context: ssl.SSLContext, token: str, bodies: list[bytes], *, keep_alive: bool) -> list[float]:
    """Milliseconds per review, send to parsed answer; every answer is checked."""
    import httpx

    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    limits = httpx.Limits(max_keepalive_connections=1 if keep_alive else 0)
    times = []
    with httpx.Client(base_url=base, verify=context, limits=limits, timeout=10) as client:
        for body in bodies:
            start = time.perf_counter()
            reply = client.post("/k8s/admission/", content=body, headers=headers)
            answer = reply.json()
            times.append((time.perf_counter() - start) * 1000)
            if reply.status_code != 200 or answer["response"]["allowed"] is not True:
                sys.exit(f"unexpected answer {reply.status_code}: {reply.text[:300]}")
    return times


def _percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[round(q * 10) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=1000, help="reviews per connection mode (default 1000)")
    args = parser.parse_args()
    if args.reviews < 10:
        parser.error(f"expected at least 10 reviews, got {args.reviews}")

    work = Path(tempfile.mkdtemp(prefix="hcs-bench-webhook-"))
    ca, cert, key = _tls(work)
    env, server_url = _database_env(work / "state")
    os.environ.update(env)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hcsportal.settings")
    import django

    django.setup()
    # The portal's logging settings log every httpx request at INFO; the client's log is not what is timed.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    token = _seed()
    from django.db import connections

    connections.close_all()

    injected = _pod({"hcs.io/gpu": "2(A100-80G)", "hcs.io/injected": "nvidia"})
    injected["spec"]["containers"][0].update(
        resources={"limits": {"nvidia.com/gpu": "2"}},
        env=[
            {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64:/usr/local/nvidia/lib:/usr/local/cuda/lib64"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ],
        volumeMounts=[
            {"name": "hcs-nvidia-driver", "mountPath": "/usr/local/nvidia", "readOnly": True},
            {"name": "hcs-shm", "mountPath": "/dev/shm"},
        ],
    )
    injected["spec"].update(
        volumes=[
            {"name": "hcs-nvidia-driver", "hostPath": {"path": "/usr/local/nvidia", "type": "Directory"}},
            {"name": "hcs-shm", "emptyDir": {"medium": "Memory"}},
        ],
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        runtimeClassName="nvidia",
    )
    kinds = [
        ("annotation", lambda: _review(_pod({"hcs.io/gpu": "2(A100-80G)"}))),
        ("already injected", lambda: _review(injected)),
        ("vendor resource", lambda: _review(_pod(limits={"huawei.com/Ascend910": "8"}))),
        ("not enrolled", lambda: _review(_pod({"hcs.io/gpu": "2(A100-80G)"}), namespace="kube-system")),
    ]
    server, port = _start_server(env, cert, key)
    try:
        base = f"https://{HOST}:{port}"
        context = ssl.create_default_context(cafile=ca)
        # The already-injected pod must really be a no-op, or the benchmark times the wrong thing.
        check = _review(injected)
        import httpx

        answer = httpx.post(
            f"{base}/k8s/admission/", json=check, headers={"Authorization": f"Bearer {token}"}, verify=context
        ).json()["response"]
        if "patch" in answer:
            sys.exit(f"the injected pod still got a patch: {base64.b64decode(answer['patch']).decode()}")
        warmup = [json.dumps(kinds[i % 4][1]()).encode() for i in range(50)]
        _measure(base, context, token, warmup, keep_alive=True)
        rows = []
        for mode, keep_alive in (("kept-alive connection", True), ("new TLS connection each", False)):
            labels = [kinds[i % len(kinds)][0] for i in range(args.reviews)]
            bodies = [json.dumps(kinds[i % len(kinds)][1]()).encode() for i in range(args.reviews)]
            times = _measure(base, context, token, bodies, keep_alive=keep_alive)
            p99 = _percentile(times, 99)
            rows.append(
                [
                    mode,
                    "all",
                    len(times),
                    _percentile(times, 50),
                    p99,
                    max(times),
                    "yes" if p99 < TARGET_P99_MS else "NO",
                ]
            )
            for name, _ in kinds:
                part = [t for t, label in zip(times, labels, strict=True) if label == name]
                rows.append(["", name, len(part), _percentile(part, 50), _percentile(part, 99), max(part), ""])
        database = "PostgreSQL" if server_url else "SQLite (embedded)"
        print(f"Admission webhook over HTTPS on loopback, 1 uvicorn worker, {database}")
        print_table(["connection", "reviews", "n", "p50 ms", "p99 ms", "max ms", f"p99 < {TARGET_P99_MS:.0f} ms"], rows)
    finally:
        server.terminate()
        server.wait(10)
        if server_url:
            import psycopg

            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')


if __name__ == "__main__":
    main()
