"""sys.exit(N), os._exit(N) and sys.exit from a thread: `exit_codes.py sys|os|thread`."""
import os
import sys
import threading

how = sys.argv[1]
print(f"about to leave by {how}", flush=True)
if how == "sys":
    sys.exit(3)
if how == "os":
    os._exit(4)
worker = threading.Thread(target=sys.exit, args=(5,))  # ends only the thread
worker.start()
worker.join()
print("the thread's sys.exit ended the thread only")
