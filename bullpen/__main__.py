"""Allow `python -m bullpen`."""

from bullpen.cli import main

main()
