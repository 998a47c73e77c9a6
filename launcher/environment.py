"""Names of the environment variables the launcher gives every rank. A module of its own so that
the user side (CLI, supervisor, rendering) can name them without importing the rank's bootstrap."""

RUN_DIR_ENV = "JAXLAUNCH_RUN_DIR"
# Set by the supervisor: 0 for the first attempt, 1 after the first restart, ...
ATTEMPT_ENV = "JAXLAUNCH_ATTEMPT"
# Set by the supervisor for each attempt: where its control server listens (host:port), and the
# secret a rank's connection must open with (launcher/channel.py).
CONTROL_ENV = "JAXLAUNCH_CONTROL"
CONTROL_TOKEN_ENV = "JAXLAUNCH_CONTROL_TOKEN"
# Set by the user (spec env, or the batch environment): the address the supervisor binds to when
# the compute nodes reach the batch node by another name than Slurm's NodeAddr.
CONTROL_HOST_ENV = "JAXLAUNCH_CONTROL_HOST"
# Set when the ranks run in a container image: jaxlaunch's version on the host (the supervisor's),
# which the preflight compares with the image's.
HOST_VERSION_ENV = "JAXLAUNCH_HOST_VERSION"
# Set by the supervisor: the owner's key (launcher/owner_key.py), with which ranks check the
# files they unpickle (a function job's call.pkl) and sign the ones they write (result.pkl).
OWNER_KEY_ENV = "JAXLAUNCH_OWNER_KEY"
