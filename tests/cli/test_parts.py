"""The client's parts that need no server: the login file, API error messages, tables and times."""

from __future__ import annotations

import stat
from datetime import UTC, datetime

import pytest

from hcs_cli import config
from hcs_cli.client import ApiError
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


def test_api_errors_print_one_message_a_line_with_their_field():
    body = {"gpu_spec": ["expected a count"], "non_field_errors": ["too big"], "volumes": [{"name": ["bad"]}]}
    assert ApiError(400, body).lines() == ["gpu_spec: expected a count", "too big", "volumes.name: bad"]
    assert ApiError(403, {"detail": "Viewers cannot submit."}).lines() == ["Viewers cannot submit."]
    assert ApiError(502, None).lines() == ["HTTP 502"]


def test_tables_align_columns_and_times_say_how_far_away_they_are():
    assert table(["ID", "NAME"], [[1, "bert"], [12, None]]) == "ID  NAME\n1   bert\n12  -"
    assert [relative(s) for s in (0, 30, -30, 180, -7200, 2 * 86400)] == [
        "now", "in a few s", "a few s ago", "in 3 min", "2 h ago", "in 2 d",
    ]  # fmt: skip
    now = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    shown = when("2026-11-23T12:03:00Z", now=now)
    assert shown.endswith("(in 3 min)") and shown[:4] == "2026"
    assert when(None) == ""
