"""atexit handlers run last registered first, after the main module ends, with their output."""
import atexit
import sys


@atexit.register
def first():
    print("atexit: registered first, runs last")


@atexit.register
def second():
    print("atexit: registered second, runs first", file=sys.stderr)


print("main body ends")
