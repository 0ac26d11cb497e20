"""`mythic config show`: the effective configuration."""

from __future__ import annotations

import typer
import yaml

from mythic.cli._console import load_config, out
from mythic.cli._options import ConfigOption

config_app = typer.Typer(help="Show the effective configuration.")


@config_app.command("show")
def config_show(config: ConfigOption = None) -> None:
    """Print the effective configuration as YAML (file, environment and defaults merged)."""
    settings = load_config(config)
    out.print(yaml.safe_dump(settings.model_dump(mode="json"), sort_keys=False).rstrip())
