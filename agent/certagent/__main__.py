import sys

from certagent.cli.commands import main

sys.exit(main())
