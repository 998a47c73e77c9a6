"""absl's app, flags and logging, as absl's docs teach them."""
from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_integer("steps", 3, "How many steps.")
flags.DEFINE_string("name", "world", "Who to greet.")


def main(argv):
    del argv
    logging.set_verbosity(logging.INFO)
    for step in range(FLAGS.steps):
        print(f"step {step} of {FLAGS.steps}: hello {FLAGS.name}")
    logging.warning("absl warning after %d steps", FLAGS.steps)


if __name__ == "__main__":
    app.run(main)
