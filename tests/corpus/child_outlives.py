"""A program that starts a subprocess which outlives it (a metrics service, say)."""
import subprocess
import sys

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(8)"])
print("started a child that keeps running")
