"""What every settings section shares."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A settings section: unknown keys are refused, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)
