"""Allow `python -m bullpen`."""

from bullpen.cli import main

if __name__ == "__main__":  # not when a spawned child (`bullpen serve --processes`) loads it
    main()
