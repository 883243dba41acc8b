"""Process-group guard for subprocess actions; run as a script, imports nothing of Conveyor.

    python -I guard.py ARGV...

The runner starts this as the leader of a new process group; it runs ARGV as its
child in that group and exits the way the child did. If the worker dies (SIGKILL,
OOM kill) the kernel sends this guard SIGTERM (PR_SET_PDEATHSIG), and the guard kills
the whole group: the action, and whatever it spawned, must not keep running once its
execution is being recovered elsewhere. Written by hand because no library does this
small Linux-specific thing.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(argv: list[str]) -> int:
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the worker died before prctl took effect
        return 137
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            os.write(2, f"cannot start {argv[0]!r}: {exc.strerror}\n".encode())
            os._exit(127)

    def worker_gone(signum: int, frame: object) -> None:
        if os.getppid() != parent:
            os.killpg(0, signal.SIGKILL)  # takes this guard down too
        # Otherwise a SIGTERM for the group (a timeout): the child got it as well.

    signal.signal(signal.SIGTERM, worker_gone)
    while True:
        try:
            _, status = os.waitpid(child, 0)
            break
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # die the same way, so the runner sees the signal
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
