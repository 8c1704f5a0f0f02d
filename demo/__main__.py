import sys

from demo.run import main

sys.exit(main())
