"""The client's parts that need no server: the login file, API error messages, tables and times."""

from __future__ import annotations

import os
import stat
import uuid
from datetime import UTC, datetime

import pytest

from hcs_cli import commands, config
from hcs_cli.client import ApiError, ConnectionFailed
from hcs_cli.output import relative, table, when


@pytest.fixture
def config_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    monkeypatch.delenv("HCS_URL", raising=False)
    monkeypatch.delenv("HCS_TOKEN", raising=False)
    return tmp_path


def test_the_login_file_is_private_and_the_environment_overrides_it(config_home, monkeypatch):
    path = config.config_path()
    path.parent.mkdir()
    path.write_text("{}")
    path.chmod(0o644)  # left readable by an older tool: the token must not stay so
    config.save(config.Config("https://portal.example", "t0k3n", "alice"))
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert config.load() == config.Config("https://portal.example", "t0k3n", "alice")
    monkeypatch.setenv("HCS_URL", "127.0.0.1:8000/")
    monkeypatch.setenv("HCS_TOKEN", "other")
    assert config.load() == config.Config("http://127.0.0.1:8000", "other", "alice")
    assert config.load("https://elsewhere.example/api/v1/").url == "https://elsewhere.example"
    assert config.forget() and not config.forget()


def test_a_broken_login_file_says_how_to_mend_it(config_home):
    config.config_path().parent.mkdir()
    config.config_path().write_text("{not json")
    with pytest.raises(config.ConfigError, match="run `hcs login` again"):
        config.load()


def test_the_login_file_is_never_written_or_read_through_a_link(config_home, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text("")
    path = config.config_path()
    path.parent.mkdir(mode=0o700)
    path.symlink_to(elsewhere)
    with pytest.raises(config.ConfigError, match="config.json: it is a symbolic link"):
        config.save(config.Config("https://portal.example", "t0k3n"))
    assert elsewhere.read_text() == "" and path.is_symlink()
    elsewhere.write_text('{"url": "https://evil.example", "token": "planted"}')
    elsewhere.chmod(0o600)
    with pytest.raises(config.ConfigError, match="it is a symbolic link .remove it."):
        config.load()
    assert not list(path.parent.glob(".config.json.*")), "no temporary file is left behind"


def test_a_linked_or_shared_login_directory_is_refused(config_home, tmp_path):
    other = tmp_path / "other-dir"
    other.mkdir(mode=0o700)
    config.config_path().parent.symlink_to(other, target_is_directory=True)
    with pytest.raises(config.ConfigError, match="hcs: it is a symbolic link or not a directory"):
        config.save(config.Config("https://portal.example", "t0k3n"))
    assert not list(other.iterdir())
    config.config_path().parent.unlink()
    config.config_path().parent.mkdir()
    config.config_path().parent.chmod(0o777)
    with pytest.raises(config.ConfigError, match=r"others may write to it \(mode 0777; chmod 700 it\)"):
        config.save(config.Config("https://portal.example", "t0k3n"))
    assert not config.config_path().exists()


def test_a_login_file_others_may_read_or_of_another_user_is_refused(config_home, monkeypatch):
    config.save(config.Config("https://portal.example", "t0k3n", "alice"))
    path = config.config_path()
    path.chmod(0o640)
    with pytest.raises(config.ConfigError, match="others may read or write it .mode 0640, expected 0600."):
        config.load()
    path.chmod(0o600)
    assert config.load().token == "t0k3n"
    mine = os.getuid()
    monkeypatch.setattr(config.os, "getuid", lambda: mine + 1)
    with pytest.raises(config.ConfigError, match=f"it belongs to uid {mine}, not to you"):
        config.load()


def test_a_submit_that_got_no_answer_is_sent_again_under_the_same_key(monkeypatch, capsys):
    monkeypatch.setattr(commands, "SUBMIT_RETRY_DELAY_S", 0)
    sent = []

    class FlakyApi:
        def post(self, path, json=None, headers=None):
            sent.append(headers["Idempotency-Key"])
            if len(sent) < 3:
                raise ConnectionFailed("Cannot reach the portal: connection reset")
            return {"id": 7}

    assert commands._post_once("tasks/", {}, FlakyApi()) == {"id": 7}
    assert len(sent) == 3 and len(set(sent)) == 1 and uuid.UUID(sent[0]).version == 4
    assert capsys.readouterr().err.count("retrying with the same Idempotency-Key") == 2
    first_key = sent[0]
    sent.clear()
    commands._post_once("tasks/", {}, FlakyApi())
    assert sent[0] != first_key, "each submit has its own key"

    class DeadApi:
        def post(self, path, json=None, headers=None):
            raise ConnectionFailed("Cannot reach the portal")

    with pytest.raises(ConnectionFailed):
        commands._post_once("tasks/", {}, DeadApi())


def test_api_errors_print_one_message_a_line_with_their_field():
    body = {"gpu_spec": ["expected a count"], "non_field_errors": ["too big"], "volumes": [{"name": ["bad"]}]}
    assert ApiError(400, body).lines() == ["gpu_spec: expected a count", "too big", "volumes.name: bad"]
    assert ApiError(403, {"detail": "Viewers cannot submit."}).lines() == ["Viewers cannot submit."]
    assert ApiError(502, None).lines() == ["HTTP 502"]


def test_tables_align_columns_and_times_say_how_far_away_they_are():
    assert table(["ID", "NAME"], [[1, "bert"], [12, None]]) == "ID  NAME\n1   bert\n12  -"
    assert [relative(s) for s in (0, 30, -30, 180, -7200, 2 * 86400)] == [
        "now",
        "in a few s",
        "a few s ago",
        "in 3 min",
        "2 h ago",
        "in 2 d",
    ]
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    shown = when("2026-11-23T12:03:00Z", now=now)
    assert shown.endswith("(in 3 min)") and shown[:4] == "2026"
    assert when(None) == ""


def test_schedule_min_sends_each_entry_as_its_line_for_the_api_to_read():
    from hcs_cli.__main__ import parser

    args = parser().parse_args(
        ["submit", "-p", "alpha", "-n", "svc", "--autoscale-min", "1", "--autoscale-max", "4"]
        + [
            "--schedule-min",
            "Mon-Fri 08:00-20:00 4",
            "--schedule-min",
            "Sat 10:00-14:00 2 Europe/Berlin",
            "--",
            "serve",
        ]
    )
    body = commands._submit_body(args)
    assert body["autoscale_schedule"] == ["Mon-Fri 08:00-20:00 4", "Sat 10:00-14:00 2 Europe/Berlin"]


def test_scale_to_zero_and_the_request_targets_go_into_the_submission():
    from hcs_cli.__main__ import parser

    args = parser().parse_args(
        ["submit", "-p", "alpha", "-n", "svc", "-k", "inference", "--port", "8000", "--scale-to-zero-after", "600"]
        + ["--autoscale-min", "1", "--autoscale-max", "3", "--autoscale-rps", "20", "--autoscale-concurrency", "4"]
        + ["--autoscale-latency-ms", "250", "--", "serve"]
    )
    body = commands._submit_body(args)
    assert (body["scale_to_zero_after_s"], body["autoscale_rps"]) == (600, 20)
    assert (body["autoscale_concurrency"], body["autoscale_latency_ms"]) == (4, 250)


def test_a_503_with_retry_after_is_waited_out_for_requests_safe_to_send_again(monkeypatch, capsys):
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from hcs_cli import client as client_module

    sleeps = []
    monkeypatch.setattr(client_module.time, "sleep", sleeps.append)
    seen = []

    class Flaky(BaseHTTPRequestHandler):
        def _answer(self):
            seen.append((self.command, self.headers.get("Idempotency-Key")))
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            busy = len(seen) % 3 != 0  # two 503s, then an answer
            body = json.dumps({"detail": "The database connection was lost; try again in 2 s."} if busy else {"ok": 1})
            self.send_response(503 if busy else 200)
            if busy:
                self.send_header("Retry-After", "2")
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = client_module.Client(f"http://127.0.0.1:{server.server_port}", "t0k3n")
        assert api.get("tasks/1/logs/") == {"ok": 1}
        assert sleeps == [2.0, 2.0]
        assert capsys.readouterr().err.count("try again in 2 s. (retrying in 2 s)") == 2
        # Under an Idempotency-Key a POST is sent again too (the server creates the task once).
        assert api.post("tasks/", json={}, headers={"Idempotency-Key": "k"}) == {"ok": 1}
        assert [key for _, key in seen[3:]] == ["k", "k", "k"]
        # A POST without one is not: the 503 is the answer.
        seen.clear()
        with pytest.raises(ApiError) as refused:
            api.post("tasks/", json={})
        assert refused.value.status == 503 and len(seen) == 1
        # A server that stays unavailable: its 503 after UNAVAILABLE_RETRIES more tries.
        monkeypatch.setattr(Flaky, "do_GET", _always_busy)
        busy_answers.clear()
        with pytest.raises(ApiError) as unavailable:
            api.get("tasks/")
        assert unavailable.value.status == 503 and len(busy_answers) == 1 + client_module.UNAVAILABLE_RETRIES
    finally:
        server.shutdown()


busy_answers: list[str] = []


def _always_busy(handler):
    busy_answers.append(handler.path)
    handler.send_response(503)
    handler.send_header("Retry-After", "1")
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", "2")
    handler.end_headers()
    handler.wfile.write(b"{}")
