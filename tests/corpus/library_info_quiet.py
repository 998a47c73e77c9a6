"""A library that logs at INFO while the program never configures logging: python prints nothing
but WARNING and up (the last-resort handler)."""
import logging

library = logging.getLogger("chatty.library")
library.info("an INFO line nobody asked for")
library.warning("a warning everybody sees")
print("done")
