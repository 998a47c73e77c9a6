"""tensorboardX's SummaryWriter, as its README teaches it, one log folder per process."""
import os

from tensorboardX import SummaryWriter

rank = os.environ.get("OMPI_COMM_WORLD_RANK", "0")
writer = SummaryWriter(logdir=f"tb/rank{rank}")
for step in range(5):
    writer.add_scalar("loss", 1.0 / (step + 1), step)
writer.close()
print("wrote", sorted(os.listdir(f"tb/rank{rank}")) != [])
