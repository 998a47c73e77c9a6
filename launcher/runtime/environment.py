"""Names of the environment variables the launcher gives every rank. A module of its own so that
the user side (CLI, supervisor, rendering) can name them without importing the rank's bootstrap."""

RUN_DIR_ENV = "JAXLAUNCH_RUN_DIR"
# Set by the supervisor: 0 for the first attempt, 1 after the first restart, ...
ATTEMPT_ENV = "JAXLAUNCH_ATTEMPT"
