import sys

from evalrun.cli.main import main

sys.exit(main())
