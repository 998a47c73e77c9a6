"""concurrent.futures thread and process pools, left open (the interpreter's exit ends them)."""
import concurrent.futures as cf


def cube(x):
    return x ** 3


if __name__ == "__main__":
    threads = cf.ThreadPoolExecutor(2)
    processes = cf.ProcessPoolExecutor(2)
    print(list(threads.map(cube, range(4))), list(processes.map(cube, range(4))))
