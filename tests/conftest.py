import os

# Tests run beside real server and worker processes on two cores; more than one OpenMP thread
# per process makes them spin against each other (25x slower measured), so one it is.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

pytest_plugins = ["tests.fixtures_models", "tests.fixtures_service"]
