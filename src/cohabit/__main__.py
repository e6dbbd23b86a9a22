"""`python -m cohabit` runs the command line."""

from cohabit.cli.app import main

main()
