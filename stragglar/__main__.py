"""``python -m stragglar``: the ``stragglar`` command where its console script is not on PATH."""

from stragglar.cli import main

if __name__ == "__main__":
    main()
