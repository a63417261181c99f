"""The ``notary`` command line.

Exit status: 0 success, 1 runtime failure (store, network), 2 usage error;
`notary check`: 0 verified, 1 rejected by the vote (and nothing else),
2 usage error, 3 inconclusive, 4 site unreachable, 5 the check itself failed;
`notary log`: 0 consistent, 1 the log is inconsistent, 2 usage error,
3 equivocation, 4 the log could not be read, 5 the command itself failed,
6 a faulty consistency proof (watch: the entries show the checkpoints
consistent), 7 verify checked only the first --max-entries entries (no
problem in them).
Every error is one line on stderr, never a traceback.

One module per command family (``keys``, ``bundle``, ``check`` with its
``report``, ``log``, ``db``, ``serve``); ``dispatch`` builds the parser
from them and runs the command.
"""

from notary.cli.dispatch import build_parser, main

__all__ = ["build_parser", "main"]
