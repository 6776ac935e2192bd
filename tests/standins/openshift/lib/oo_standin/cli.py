"""Option parsing and output as the Ruby admin tools do it.

Both tools parse with Ruby's GetoptLong (long options may be abbreviated to a
unique prefix, ``--opt=value`` or ``--opt value``, short ``-cVALUE`` or ``-c VALUE``,
operands are permuted away and ignored, a repeated option keeps its last value)
and print with ``puts``.
"""

import getopt
import sys


class UsageError(Exception):
    """GetoptLong::Error: an unknown option, an ambiguous prefix or a missing argument."""


def parse(argv, specs):
    """Parses ``argv`` with ``specs`` = [(long, short or None, takes_argument)].

    Returns {"--long": value or ""}, keyed by the canonical long name as
    GetoptLong yields it.
    """
    shorts = ""
    longs = []
    by_short = {}
    for long, short, has_arg in specs:
        longs.append(long[2:] + ("=" if has_arg else ""))
        if short:
            shorts += short[1:] + (":" if has_arg else "")
            by_short[short] = long
    try:
        opts, _operands = getopt.gnu_getopt(argv, shorts, longs)
    except getopt.GetoptError as e:
        raise UsageError(str(e)) from e
    out = {}
    for k, v in opts:
        out[by_short.get(k, k)] = v
    return out


def puts(text=""):
    """Ruby's ``puts``: adds a newline unless the text already ends with one."""
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


def ruby_inspect(v):
    """A value as Ruby's ``inspect`` prints it (strings, numbers, booleans, nil, arrays, hashes)."""
    if v is None:
        return "nil"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(ruby_inspect(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{ruby_inspect(k)}=>{ruby_inspect(x)}" for k, x in v.items()) + "}"
    return ruby_inspect(str(v))


def ruby_pretty_hash(h):
    """A hash as ``pretty_inspect`` prints a long one: one pair per line (approximately)."""
    pairs = [f"{ruby_inspect(k)}=>{ruby_inspect(v)}" for k, v in h.items()]
    if not pairs:
        return "{}\n"
    return "{" + ",\n ".join(pairs) + "}\n"
