"""A torchrun worker that never finishes: it leaves its pid in $SLEEPER_MARKS and sleeps, so
that a test can stop its launchers while every worker is certainly running."""

import os
import time
from pathlib import Path

Path(os.environ["SLEEPER_MARKS"], str(os.getpid())).write_text(os.environ.get("RANK", "?"))
time.sleep(600)
