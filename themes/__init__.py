"""The shipped colour themes (TOML files), installed as the package opsconsole.themes (see opsconsole/tui/themes.py)."""
