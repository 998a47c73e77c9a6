"""The program configures Python logging itself (logging HOWTO, basic tutorial)."""
import logging

logging.basicConfig(level=logging.DEBUG, format="%(levelname)s:%(name)s:%(message)s")
log = logging.getLogger("train")
log.debug("a debug line the program asked for")
log.info("an info line")
logging.getLogger("some.library").debug("a library's debug line")
print("result: 42")
