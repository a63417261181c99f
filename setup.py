"""Build the optional compiled modules: the cache (``notary._fastcache``)
the request path (``notary.protocol._fastrequest``, issue 21; it compiles
the vendored llhttp in with it) and the HTTPS
listeners' TLS driver (``notary.server._fasttls``, issue 35; it needs no
OpenSSL headers: it finds OpenSSL in Python's own ``_ssl`` when imported).

The extensions are optional: when Cython or a C compiler is missing, or
``NOTARY_NO_EXTENSIONS=1`` is set, the project installs in pure-Python mode and
``notary.extensions`` picks each module's twin (``<module>_py.py``).
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_ext import build_ext

LLHTTP = "notary/_vendor/llhttp"


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
            f"WARNING: an extension was not compiled ({exc}); "
            "its pure-Python twin will be used instead.",
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
        ["notary/_fastcache.pyx", "notary/protocol/_fastrequest.pyx", "notary/server/_fasttls.pyx"],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        quiet=True,
    )
    for ext in exts:
        # cythonize() drops optional=True; set it on what it returns.
        ext.optional = True
        if ext.name == "notary.protocol._fastrequest":
            # The request reader drives llhttp itself (notary/_vendor/llhttp).
            ext.include_dirs.append(f"{LLHTTP}/include")
            ext.sources += [f"{LLHTTP}/src/{name}.c" for name in ("api", "http", "llhttp")]
    return exts


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
