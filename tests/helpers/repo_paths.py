"""Where the tests' files are: the repository, the tests folder and its assets, the helpers."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
HELPERS = TESTS / "helpers"
