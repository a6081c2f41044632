"""What the benchmarks share for the processes they run: a free loopback port for a redis-server
or a metrics endpoint, and stopping what they started.

Imported by the scripts under bench/ (bench/sim/ puts bench/ on its path first).
"""
import signal
import socket
import subprocess


def free_port():
    """A loopback TCP port nothing listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_all(procs, timeout_s):
    """SIGTERM every process still running, the last started first; SIGKILL one that has not
    exited timeout_s later, and reap it."""
    for p in reversed(procs):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
