"""`python -m hypha.accelerate_executor.platform.launcher`: the launcher's command line."""

import sys

from hypha.accelerate_executor.platform.launcher.command import main

sys.exit(main())
