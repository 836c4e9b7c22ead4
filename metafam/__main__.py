"""``python -m metafam COMMAND``: see `metafam.cli`."""

from metafam.cli import run

if __name__ == "__main__":
  run()
