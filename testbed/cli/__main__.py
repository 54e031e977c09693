"""`python -m testbed.cli ...`: the `testbed` command without the console script (what the
runner uses to start the link emulator, and what the compose image's `testbed` wraps)."""

import sys

from testbed.cli import main

if __name__ == "__main__":  # importing the module (pkgutil.walk_packages) must not run it
    sys.exit(main())
