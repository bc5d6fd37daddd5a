"""``python -m kinetoscope.cli``: the command's own process, as the console script."""

from kinetoscope.cli import run

if __name__ == "__main__":  # pragma: no cover
    run()
