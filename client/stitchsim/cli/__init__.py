"""The `stitchsim` command: check, compare, jobs, report (one module a command family).

Exit codes are in exits.py; main.py is the entry point.
"""

from stitchsim.cli.exits import exit_code_for
from stitchsim.cli.main import main
from stitchsim.cli.parser import build_parser
from stitchsim.cli.spec_args import spec_fields

__all__ = ["build_parser", "exit_code_for", "main", "spec_fields"]
