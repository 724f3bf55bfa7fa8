"""``python -m warmup``: the same CLI as ``sglang-warmup``."""

from warmup.cli import main

if __name__ == "__main__":
    main()
