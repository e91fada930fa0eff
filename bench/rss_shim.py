"""Run a command as the child of this small process and write the child's own peak RSS (KiB) and its CPU
seconds (user, system: the command and the worker processes it waited for, as /usr/bin/time counts) to a
file.

    python bench/rss_shim.py OUT_FILE CMD [ARGS...]

Linux charges a forked child at least its parent's RSS when it execs (the old address space's high-water
mark is kept in the child's rusage), so a measurement taken by a bench process that has grown (it reads
run directories back) would be inflated. Starting the command from this ~10 MB process keeps `ru_maxrss`
the command's own. The exit code is the command's.
"""

from __future__ import annotations

import os
import subprocess
import sys


def main() -> None:
    out, cmd = sys.argv[1], sys.argv[2:]
    p = subprocess.Popen(cmd)
    _, status, ru = os.wait4(p.pid, 0)
    with open(out, "w") as f:
        f.write(f"{int(ru.ru_maxrss)} {ru.ru_utime:.3f} {ru.ru_stime:.3f}")
    sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
