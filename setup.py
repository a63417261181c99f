"""Build the optional compiled cache (``notary.state._fastcache``).

The extension is optional: when Cython or a C compiler is missing, or
``NOTARY_NO_EXTENSIONS=1`` is set, the project installs in pure-Python mode and
``notary.state.cache`` uses the twin in ``notary/state/_fastcache_py.py``.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    """Compile extensions, but keep installing when compilation fails."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means pure mode
            self._warn(exc)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._warn(exc)

    @staticmethod
    def _warn(exc):
        print(
            f"WARNING: notary.state._fastcache was not compiled ({exc}); "
            "installing the pure-Python cache instead.",
            file=sys.stderr,
        )


def extensions():
    if os.environ.get("NOTARY_NO_EXTENSIONS") == "1":
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        return []
    exts = cythonize(
        ["notary/state/_fastcache.pyx"],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        quiet=True,
    )
    for ext in exts:
        # cythonize() drops optional=True; set it on what it returns.
        ext.optional = True
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
