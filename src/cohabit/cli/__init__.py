"""The `cohabit` command line (typer + rich)."""
