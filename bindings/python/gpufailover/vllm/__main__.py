# SPDX-License-Identifier: Apache-2.0
"""``python -m gpufailover.vllm serve ...``: the ``gf-vllm`` console script."""
import sys

from .serve import main

if __name__ == "__main__":
    sys.exit(main())
