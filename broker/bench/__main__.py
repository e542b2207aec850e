"""``python -m broker.bench writer|reader|channels ...``"""

import sys

from . import main

sys.exit(main())
