# SPDX-License-Identifier: Apache-2.0
"""scaled(seconds): how long a test may wait for something on this machine.

Waits in the tests are bounds against hangs, never speed claims; a loaded
machine (a second test run beside this one, a sanitizer build) needs longer
ones. GF_TEST_TIMEOUT_SCALE (a number >= 1, default 1) multiplies every one;
when the programs under test run under AddressSanitizer or ThreadSanitizer
(ASAN_OPTIONS or TSAN_OPTIONS set, or the runtime preloaded) it is three
times larger again, as the C tests' TU_MS() (tests/common/testutil.h).
"""
import os


def _scale():
    scale = 1.0
    try:
        v = float(os.environ.get("GF_TEST_TIMEOUT_SCALE", "1"))
        if 1 <= v <= 1000:
            scale = v
    except ValueError:
        pass
    preload = os.environ.get("LD_PRELOAD", "")
    if (os.environ.get("ASAN_OPTIONS") or os.environ.get("TSAN_OPTIONS") or "libasan" in preload
            or "libtsan" in preload):
        scale *= 3
    return scale


SCALE = _scale()


def scaled(seconds):
    """@seconds of waiting, scaled for this machine (see the module's text)."""
    return seconds * SCALE
