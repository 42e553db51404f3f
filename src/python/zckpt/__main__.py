"""`python -m zckpt ARGS...` runs the zckpt command-line tool, as `zckpt ARGS...` does."""
from _zckpt_cli import main

main()
