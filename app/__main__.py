"""`specscope`: the window by default; `specscope chat | ocr | bench | convert | models` on the
command line (see app/cli/; app/launch.py sets up the process first)."""

import sys

from app.launch import entry

if __name__ == "__main__":
    sys.exit(entry())
