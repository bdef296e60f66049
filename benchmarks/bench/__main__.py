"""`python -m benchmarks.bench`: the same as `tierserve bench`."""

import sys

from benchmarks.bench.cli import main

sys.exit(main())
