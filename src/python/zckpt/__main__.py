"""`python -m zckpt ARGS...` runs the zckpt command-line tool, as `zckpt ARGS...` does, except for
`reshard`, the one command that needs torch: it runs here (the tool's own `zckpt reshard` execs
`python -m zckpt reshard`, so handing it back to the tool would loop)."""
import sys

if sys.argv[1:2] == ["reshard"]:
    from .reshard import main as reshard

    sys.exit(reshard(sys.argv[2:]))

from _zckpt_cli import main

main()
