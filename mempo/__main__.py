"""``python -m mempo <command>``: the `mempo` command line (`mempo.apps.cli`), e.g. under
``torchrun -m mempo train``."""
import sys

from mempo.apps.cli import main

sys.exit(main())
