import sys

from stitchsim.cli.main import main

sys.exit(main())
