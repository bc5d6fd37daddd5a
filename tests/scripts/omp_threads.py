"""Sets OMP_NUM_THREADS before importing torch, as a careful script does; reports what torch uses."""

import os
import sys

before = "torch" in sys.modules
os.environ["OMP_NUM_THREADS"] = "1"
import torch  # noqa: E402

print(f"torch imported before the script: {before}; threads: {torch.get_num_threads()}", flush=True)
