import sys

from mpgpu_edu.cli import main

sys.exit(main())
