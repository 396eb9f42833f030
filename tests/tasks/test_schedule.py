"""Scheduled minimums (apps/tasks/schedule.py): what the entries say at a moment, and their one-line form."""

from datetime import UTC, datetime

import pytest

from apps.tasks import schedule

# Wednesday 25 November 2026.
WED = datetime(2026, 11, 25, tzinfo=UTC)


def at(day_offset, hour, minute=0):
    return WED.replace(day=25 + day_offset, hour=hour, minute=minute)


def entry(line):
    return schedule.parse_line(line)


def test_an_entry_holds_from_its_start_to_just_before_its_end_on_its_days():
    office = [entry("Mon-Fri 08:00-20:00 4")]
    assert schedule.floor_at(office, at(0, 7, 59)) is None
    assert schedule.floor_at(office, at(0, 8)) == 4
    assert schedule.floor_at(office, at(0, 19, 59)) == 4
    assert schedule.floor_at(office, at(0, 20)) is None
    assert schedule.floor_at(office, at(3, 12)) is None  # Saturday


def test_a_window_across_midnight_belongs_to_the_day_it_starts_on():
    night = [entry("Fri 22:00-02:00 3")]
    assert schedule.floor_at(night, at(2, 23)) == 3  # Friday 23:00
    assert schedule.floor_at(night, at(3, 1, 30)) == 3  # Saturday 01:30
    assert schedule.floor_at(night, at(0, 1, 30)) is None  # Wednesday 01:30: Tuesday has no entry


def test_the_time_zone_of_the_entry_decides():
    berlin = [entry("Wed 08:00-09:00 2 Europe/Berlin")]  # 07:00-08:00 UTC in November
    assert schedule.floor_at(berlin, at(0, 7, 30)) == 2
    assert schedule.floor_at(berlin, at(0, 8, 30)) is None


def test_the_highest_entry_holding_wins_and_the_minimum_stays_within_the_bounds():
    entries = [entry("Mon-Sun 00:00-24:00 2"), entry("Wed 12:00-13:00 5")]
    assert schedule.floor_at(entries, at(0, 12, 30)) == 5
    assert schedule.floor_at(entries, at(0, 23, 59)) == 2
    assert schedule.minimum_at(1, 4, entries, at(0, 12, 30)) == 4
    assert schedule.minimum_at(3, 6, entries, at(0, 23)) == 3


def test_days_read_ranges_that_wrap_and_lists():
    assert schedule.parse_days("Fri-Mon") == {4, 5, 6, 0}
    assert schedule.parse_days("sat,Sun") == {5, 6}
    with pytest.raises(ValueError, match="Expected days of Mon..Sun"):
        schedule.parse_days("Mon-")


def test_lines_and_objects_are_the_same_entry():
    line = "Mon-Fri 08:00-20:00 4 Europe/Berlin"
    assert schedule.format_entry(entry(line)) == line
    assert schedule.normalise([line, {"days": "Sat", "from": "10:00", "to": "11:00", "min_replicas": 1}]) == [
        entry(line),
        {"days": "Sat", "from": "10:00", "to": "11:00", "min_replicas": 1, "timezone": "UTC"},
    ]
    assert schedule.schedule_error([line] * 21, 1, 4) == "Expected at most 20 entries, got 21."
