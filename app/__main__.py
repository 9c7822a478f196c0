"""`specscope`: the window by default; `specscope chat | ocr | bench | convert | models` on the
command line (see app/cli.py)."""

import sys

from app.cli import main

if __name__ == "__main__":
    sys.exit(main())
