import sys

from gpumarket.cli import main

sys.exit(main())
