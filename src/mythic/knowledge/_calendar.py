"""The game's calendar (`calendar:` in world.yaml): its months, their seasons, how a year is
said. The game tells the date (`SceneUpdate.date`, `year-month-day` in this calendar) and the
time of day (`SceneUpdate.time`); memories carry them as game minutes (`Calendar.minutes`), so
"yesterday" and "last winter" are the game's (`Calendar.ago`) and old memories fade by the
game's days, not the player's."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from mythic._errors import MythicError

MINUTES_PER_DAY = 1440
_DATE = re.compile(r"^(\d{1,6})-(\d{1,3})-(\d{1,3})$")
_TIME = re.compile(r"^([01]\d|2[0-3]):([0-5]\d)$")

Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=40)]


class GameDateError(MythicError):
    """A game date not in the world's calendar (month 13 of a 12-month year, the 31st of a
    month of 30 days): the wire `Error` code `bad_game_date`."""

    code = "bad_game_date"


class Month(BaseModel):
    """One month of the game's year."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    """How NPCs say it (`Ashfall`, `March`)."""
    days: int = Field(ge=1, le=400)
    """Its days (1-400)."""
    season: Name | None = None
    """Its season (`winter`): "last winter" in an NPC's memory."""


def _gregorian() -> list[Month]:
    days = (31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
    names = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ]
    seasons = ["winter"] * 2 + ["spring"] * 3 + ["summer"] * 3 + ["autumn"] * 3 + ["winter"]
    return [Month(name=n, days=d, season=s) for n, d, s in zip(names, days, seasons, strict=True)]


class Calendar(BaseModel):
    """`calendar:` in world.yaml. Left out: twelve months of the Gregorian year (no leap
    days), with the northern seasons, and years said as "year 12"."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    months: list[Month] = Field(default_factory=_gregorian, min_length=1, max_length=64)
    """The months of a year, in order."""
    year: Annotated[str, StringConstraints(strip_whitespace=True, max_length=80)] = "year {n}"
    """How a year is said, `{n}` its number ("year {n} of the Strike")."""

    @field_validator("year")
    @classmethod
    def _names_the_number(cls, year: str) -> str:
        if (
            year.count("{n}") != 1
            or "{" in year.replace("{n}", "")
            or "}" in year.replace("{n}", "")
        ):
            raise ValueError('a year is said with "{n}" once for its number, no other braces')
        return year

    @property
    def year_days(self) -> int:
        return sum(m.days for m in self.months)

    def minutes(self, date: str, time: str | None = None) -> int:
        """`date` (`year-month-day`, months and days from 1) at `time` (`HH:MM`, else
        midnight) as minutes since the calendar's first day.

        Raises:
            GameDateError: `date` or `time` is not in this calendar.
        """
        match = _DATE.match(date)
        if match is None:
            raise GameDateError(f"game date {date!r}: expected year-month-day, e.g. 11-9-21")
        year, month, day = (int(g) for g in match.groups())
        if not 1 <= month <= len(self.months):
            raise GameDateError(
                f"game date {date!r}: month {month}, but the world's year has "
                f"{len(self.months)} months",
                fix="see calendar.months in world.yaml",
            )
        days = self.months[month - 1].days
        if not 1 <= day <= days:
            raise GameDateError(
                f"game date {date!r}: day {day}, but {self.months[month - 1].name} has {days}",
                fix="see calendar.months in world.yaml",
            )
        at = 0
        if time is not None:
            clock = _TIME.match(time)
            if clock is None:
                raise GameDateError(f"game time {time!r}: expected HH:MM on a 24-hour clock")
            at = int(clock.group(1)) * 60 + int(clock.group(2))
        before = sum(m.days for m in self.months[: month - 1])
        return ((year * self.year_days) + before + day - 1) * MINUTES_PER_DAY + at

    def _date(self, minutes: int) -> tuple[int, int, int]:
        """(year, month index from 0, day from 1) of `minutes`."""
        days = minutes // MINUTES_PER_DAY
        year, day = divmod(days, self.year_days)
        for index, month in enumerate(self.months):
            if day < month.days:
                return year, index, day + 1
            day -= month.days
        raise AssertionError("unreachable: a day past the year's end")

    def say(self, minutes: int) -> str:
        """The date of `minutes` as an NPC says it: "the 9th of Ashfall, year 11 of the
        Strike"."""
        year, month, day = self._date(minutes)
        said = f"the {_ordinal(day)} of {self.months[month].name}"
        return f"{said}, {self.year.replace('{n}', str(year))}"

    def season(self, minutes: int) -> str | None:
        return self.months[self._date(minutes)[1]].season

    def ago(self, then: int, now: int) -> str:
        """How long before `now` `then` was, in the game's days: "earlier today",
        "yesterday", "3 days ago", "last week", "2 weeks ago", "last winter", "in Ashfall",
        "last year", "4 years ago" ("later" for a time after now: a save loaded from
        before)."""
        if then > now:
            return "later"
        days = now // MINUTES_PER_DAY - then // MINUTES_PER_DAY
        if days == 0:
            return "earlier today"
        if days == 1:
            return "yesterday"
        if days < 7:
            return f"{days} days ago"
        if days < 14:
            return "last week"
        year_days = self.year_days
        (_, m0, _), (_, m1, _) = self._date(then), self._date(now)
        if days < 28 or (days < year_days and m0 == m1):  # a long month's first weeks
            return f"{days // 7} weeks ago"
        if days < year_days:
            season, current = self.months[m0].season, self.months[m1].season
            if season is not None and season != current:
                return f"last {season}"
            return f"in {self.months[m0].name}"
        if days < 2 * year_days:
            return "a year ago" if m0 == m1 else "last year"
        return f"{days // year_days} years ago"


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
