import sys

from streamledger.cli import main

sys.exit(main())
