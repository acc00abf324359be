"""Every rank prints that it is ready and then sleeps; used to kill ranks or the launcher."""

import os
import time

print(f"ready pid={os.getpid()}", flush=True)
time.sleep(600)
