"""The Web Console on Kubernetes: ``exec`` with a TTY into the instance's pod through the official client's stream.

The emulated API server cannot exec, so the mapping (which pod, which container, which stream options, resize
on channel 4) is tested here against a stand-in for the stream; a real cluster runs the whole path when
KUBECONFIG is set.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import pytest

from apps.clusters.executors import kubernetes as k8s
from apps.clusters.executors.base import ExecutorError, JobPhase
from apps.clusters.executors.kubernetes import KubernetesExecutor, exec_arguments, instance_pod
from apps.clusters.executors.terminal import MAX_COLS, MAX_ROWS
from tests.executors_k8s.specs import spec


def pod(name: str, phase: str = "Running", index: int | None = None) -> dict:
    annotations = {} if index is None else {"batch.kubernetes.io/job-completion-index": str(index)}
    return {"metadata": {"name": name, "annotations": annotations}, "status": {"phase": phase}}


def test_an_indexed_jobs_instance_is_the_pod_of_that_completion_index():
    pods = [pod("train-0-x", index=0), pod("train-1-y", index=1), pod("train-2-z", index=2)]
    assert instance_pod(pods, 1)["metadata"]["name"] == "train-1-y"


def test_a_deployments_instance_is_the_nth_running_replica_by_name():
    pods = [pod("svc-b"), pod("svc-a"), pod("svc-c", phase="Pending")]
    assert [instance_pod(pods, n)["metadata"]["name"] for n in (0, 1)] == ["svc-a", "svc-b"]
    with pytest.raises(ExecutorError, match="instance 2 has no running pod"):
        instance_pod(pods, 2)


def test_exec_asks_for_an_interactive_shell_with_a_tty_in_the_main_container():
    arguments = exec_arguments(pod("dev-1"), "team-a")
    assert arguments["name"] == "dev-1" and arguments["namespace"] == "team-a"
    assert arguments["container"] == "main"
    assert arguments["stdin"] and arguments["stdout"] and arguments["stderr"] and arguments["tty"]
    assert arguments["binary"] and arguments["_preload_content"] is False
    assert arguments["command"][:2] == ["/bin/sh", "-c"] and "bash -i" in arguments["command"][2]


class FakeStream:
    """Records what the executor does with the API server's exec stream."""

    def __init__(self):
        self.channels: list[tuple[int, object]] = []
        self.open = True
        self.stdout = [b"$ "]

    def is_open(self):
        return self.open

    def update(self, timeout=0):
        pass

    def read_stdout(self):
        return self.stdout.pop(0) if self.stdout else b""

    def read_stderr(self):
        return b""

    def write_stdin(self, data):
        self.channels.append((0, data))

    def write_channel(self, channel, data):
        self.channels.append((channel, data))

    def close(self):
        self.open = False


def test_open_terminal_execs_into_the_running_pod_and_relays_input_output_and_size(monkeypatch):
    executor = KubernetesExecutor(host="http://127.0.0.1:1", namespace="team-a")
    monkeypatch.setattr(executor, "_read_workload", lambda namespace, workload, name: pod(name))
    calls = []
    fake = FakeStream()

    def stream(method, **kwargs):
        calls.append((method, kwargs))
        return fake

    monkeypatch.setattr(k8s, "stream", stream)
    terminal = executor.open_terminal("team-a/pod/hcs-7-1", 0, rows=30, cols=100)

    method, kwargs = calls[0]
    assert method == executor._apis["core"].connect_get_namespaced_pod_exec
    assert kwargs["name"] == "hcs-7-1" and kwargs["namespace"] == "team-a" and kwargs["tty"]
    assert fake.channels == [(4, json.dumps({"Width": 100, "Height": 30}))]
    assert terminal.read(0.1) == b"$ "
    assert terminal.read(0.1) is None  # nothing more yet, the stream is open
    terminal.write(b"ls\r")
    terminal.resize(10_000, 10_000)
    assert fake.channels[1:] == [(0, b"ls\r"), (4, json.dumps({"Width": MAX_COLS, "Height": MAX_ROWS}))]
    terminal.close()
    assert terminal.read(0.1) == b""


def test_a_pod_that_is_not_running_has_no_terminal(monkeypatch):
    executor = KubernetesExecutor(host="http://127.0.0.1:1", namespace="team-a")
    monkeypatch.setattr(executor, "_read_workload", lambda namespace, workload, name: pod(name, phase="Pending"))
    with pytest.raises(ExecutorError, match="no running pod"):
        executor.open_terminal("team-a/pod/hcs-7-1")


@pytest.mark.kubernetes_real
@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no real cluster to run on")
def test_a_real_clusters_dev_environment_opens_a_shell_that_runs_a_command():
    executor = KubernetesExecutor(
        kubeconfig=os.environ["KUBECONFIG"], namespace=os.environ.get("HCS_K8S_TEST_NAMESPACE", "default")
    )
    unique = uuid.uuid4().hex[:6]
    ext_id = executor.submit(
        spec(
            name=f"hcs-term-{unique}",
            kind="dev_env",
            command="sleep 600",
            cpu=0.1,
            memory_gib=0.0625,
            labels={"hcs/test-run": unique},
        )
    )
    try:
        deadline = time.monotonic() + 300
        while executor.status(ext_id).phase != JobPhase.RUNNING:
            assert time.monotonic() < deadline, executor.status(ext_id)
            time.sleep(2)
        terminal = executor.open_terminal(ext_id)
        terminal.write(b"echo hcs-$((40+2))\r")
        seen = b""
        deadline = time.monotonic() + 30
        while b"hcs-42" not in seen and time.monotonic() < deadline:
            seen += terminal.read(1.0) or b""
        terminal.close()
        assert b"hcs-42" in seen, seen
    finally:
        executor.delete(ext_id)
