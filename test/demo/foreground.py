"""foreground.py CMD ARGS...: run CMD in its own process group that owns the terminal.

test/demo.sh re-runs itself through this when its stdin is a terminal. Ctrl-C sends SIGINT to
the terminal's foreground process group: without this that is make, tee and the demo together,
and GNU make kills itself with SIGINT after its recipe ends (exit 130 whatever the recipe
returned) while tee dies at once (the demo's cleanup output is lost, its writes get EPIPE). With
CMD in a group of its own that owns the terminal, Ctrl-C reaches only the demo, which cleans up
and exits 0; make and tee then end normally. SIGINT, SIGTERM and SIGHUP sent to this process
(make forwards SIGTERM to its recipe) are passed on to CMD's group. The terminal goes back to
our group when CMD ends. Exits with CMD's status (128+N if a signal N killed it).
Without a terminal, or when not in the terminal's foreground group, it just execs CMD.
"""
import os
import signal
import sys


def main(argv):
    try:
        tty = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
        foreground = os.tcgetpgrp(tty) == os.getpgrp()
    except OSError:
        foreground = False
    if not foreground:
        os.execvp(argv[0], argv)
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(tty, os.getpgrp())
        except OSError:
            pass
        signal.signal(signal.SIGTTOU, signal.SIG_DFL)
        os.close(tty)
        os.execvp(argv[0], argv)
    try:
        os.setpgid(pid, pid)
    except OSError:
        pass  # the child did it first, or already exec'd

    def forward(sig, _frame):
        try:
            os.killpg(pid, sig)
        except OSError:
            pass

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    signal.signal(signal.SIGTTOU, signal.SIG_IGN)  # to take the terminal back
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except ChildProcessError:
            status = 0
            break
    try:
        os.tcsetpgrp(tty, os.getpgrp())
    except OSError:
        pass
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
