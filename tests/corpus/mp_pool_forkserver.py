"""A multiprocessing pool (forkserver), used and left open, as many data loaders do."""
import multiprocessing as mp


def square(x):
    return x * x


if __name__ == "__main__":
    pool = mp.get_context("forkserver").Pool(2)
    print(pool.map(square, range(5)))
