import sys

from gpuheal.xid.cli import main

sys.exit(main(["xid", *sys.argv[1:]]))
