"""Everything a Ray Train worker runs (raydra.worker.loop.train_loop and its callbacks)."""

import time

# When a worker process started importing the training code (unpickling train_loop imports this
# package first): summary.json's start-up phases count the imports from here (raydra.startup).
IMPORTS_STARTED = time.time()
