import sys

from bench.versus_preload.cli import main

sys.exit(main())
