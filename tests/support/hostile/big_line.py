"""A hostile plain agent: prints one line of N MiB (argv[1], default 20) and exits."""

import sys

mib = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 20
sys.stdout.write("0123456789abcdef" * (mib * 65536) + "\n")
sys.stdout.flush()
