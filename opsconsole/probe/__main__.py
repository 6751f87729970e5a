"""`python -m opsconsole.probe`: run the probe agent (same as `python -m opsconsole.probe.agent`)."""

import sys

from opsconsole.probe.agent import main

if __name__ == "__main__":
    sys.exit(main())
