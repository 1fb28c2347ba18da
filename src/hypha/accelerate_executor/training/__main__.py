"""`python -m hypha.accelerate_executor.training`: one training rank, as the launcher starts it."""

from hypha.accelerate_executor.entry import exit_without_teardown
from hypha.accelerate_executor.training.main import main

exit_without_teardown(main())
