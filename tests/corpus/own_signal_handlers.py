"""A program with its own SIGTERM and SIGINT handlers; it shows the dispositions it sees."""
import signal


def on_term(signum, frame):
    raise SystemExit(143)


signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGINT, signal.default_int_handler)
for name in ("SIGTERM", "SIGINT", "SIGPIPE", "SIGCHLD", "SIGHUP"):
    handler = signal.getsignal(getattr(signal, name))
    print(name, getattr(handler, "__name__", handler))
