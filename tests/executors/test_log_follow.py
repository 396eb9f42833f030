"""Following a job's output: byte-offset cursors on log files (local, Slurm), and the tail-comparison
fallback for backends that cannot read from an offset."""

from __future__ import annotations

import pytest

from apps.clusters.executors import base
from apps.clusters.executors.base import Executor, LogChunk
from apps.clusters.executors.logfile import read_log_file
from apps.clusters.executors.slurm import SlurmExecutor


def test_a_cursor_returns_only_what_was_written_since(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("one\ntwo\n")
    first = read_log_file(log, after=None, tail=1)
    assert first.text == "two\n" and not first.more
    with log.open("a") as fh:
        fh.write("three\nfour")
    second = read_log_file(log, after=first.cursor)
    assert second.text == "three\nfour"
    assert read_log_file(log, after=second.cursor).text == ""
    with log.open("a") as fh:
        fh.write(" and more\n")
    assert read_log_file(log, after=second.cursor).text == " and more\n"


def test_an_empty_cursor_reads_from_the_start_and_a_missing_file_is_empty(tmp_path):
    log = tmp_path / "output.log"
    missing = read_log_file(log, after=None)
    assert missing == LogChunk("", missing.cursor)
    log.write_text("a\nb\nc\n")
    assert read_log_file(log, after=missing.cursor).text == "a\nb\nc\n"
    assert read_log_file(log, after="").text == "a\nb\nc\n"


def test_tail_counts_lines_from_the_end(tmp_path):
    log = tmp_path / "output.log"
    log.write_text("".join(f"line {n}\n" for n in range(5000)))
    assert read_log_file(log, tail=3).text == "line 4997\nline 4998\nline 4999\n"
    assert read_log_file(log, tail=10_000).text.count("\n") == 5000
    log.write_text("no newline at the end")
    assert read_log_file(log, tail=1).text == "no newline at the end"


def test_a_large_backlog_comes_in_chunks_that_say_more(tmp_path, monkeypatch):
    monkeypatch.setattr("apps.clusters.executors.logfile.LOG_CHUNK_BYTES", 10)
    log = tmp_path / "output.log"
    log.write_text("é" * 15)  # 30 bytes: a 10-byte read may end inside a character
    chunks, cursor, more = [], "", True
    while more:
        chunk = read_log_file(log, after=cursor)
        chunks.append(chunk.text)
        cursor, more = chunk.cursor, chunk.more
    assert "".join(chunks) == "é" * 15 and len(chunks) == 3
    assert all(text == "é" * 5 for text in chunks)


def test_a_half_written_character_waits_for_its_other_half(tmp_path):
    log = tmp_path / "output.log"
    log.write_bytes(b"ok " + "€".encode()[:2])
    chunk = read_log_file(log, after="")
    assert chunk.text == "ok " and not chunk.more
    with log.open("ab") as fh:
        fh.write("€".encode()[2:] + b"\n")
    assert read_log_file(log, after=chunk.cursor).text == "€\n"


@pytest.mark.parametrize("cursor", ["12", "o-1", "ox", "{}"])
def test_a_foreign_cursor_is_refused(tmp_path, cursor):
    with pytest.raises(ValueError):
        read_log_file(tmp_path / "output.log", after=cursor)


class TailOnly(Executor):
    """A backend that can only show the last lines of a job's output (the fallback's case)."""

    def __init__(self) -> None:
        self.output = ""

    def logs(self, external_id: str, tail: int = 200) -> str:
        return "".join(self.output.splitlines(keepends=True)[-tail:])

    submit = status = stop = delete = list_by_owner = health = None


def test_the_fallback_compares_tails_and_returns_whole_new_lines():
    executor = TailOnly()
    executor.output = "a\nb\nc\n"
    first = executor.read_logs("job", tail=2)
    assert first.text == "b\nc\n"
    executor.output += "d\ne"  # "e" is still being written
    second = executor.read_logs("job", after=first.cursor)
    assert second.text == "d\n"
    executor.output += "nd\nf\n"
    assert executor.read_logs("job", after=second.cursor).text == "end\nf\n"
    assert executor.read_logs("job", after="").text == "a\nb\nc\nd\nend\nf\n"


def test_the_fallback_returns_the_whole_tail_when_the_last_lines_seen_scrolled_away(monkeypatch):
    monkeypatch.setattr(base, "_FALLBACK_TAIL", 4)
    executor = TailOnly()
    executor.output = "a\nb\n"
    cursor = executor.read_logs("job").cursor
    executor.output += "".join(f"{n}\n" for n in range(10))
    assert executor.read_logs("job", after=cursor).text == "6\n7\n8\n9\n"
    with pytest.raises(ValueError):
        executor.read_logs("job", after="o12")


def test_slurm_follows_the_jobs_output_file_by_offset(tmp_path, monkeypatch):
    """The file part only: reading a job record from slurmrestd is covered by the Slurm tests."""
    output = tmp_path / "hcs-task-1-1.out"
    records = {"7": {"standard_output": str(output)}, "8": {"standard_output": str(tmp_path / "job-%j.out")}}
    executor = SlurmExecutor("http://slurmrestd.invalid", token="t", user="hcs", output_dir=str(tmp_path))
    monkeypatch.setattr(executor, "_record", records.get)
    output.write_text("epoch 1\n")
    first = executor.read_logs("7")
    with output.open("a") as fh:
        fh.write("epoch 2\n")
    assert (first.text, executor.read_logs("7", after=first.cursor).text) == ("epoch 1\n", "epoch 2\n")
    # An unexpanded pattern or an unknown job: no text, and the follower keeps its place.
    assert executor.read_logs("8", after=first.cursor) == LogChunk("", first.cursor)
    assert executor.read_logs("9") == LogChunk("", "")
