"""The command researchers type: `python train.py [group=option ...] [key=value ...]` (see --help).

`raydra train [...]`, the console command an installed raydra brings, is the same command.
"""

from raydra.entry import hydra_main

if __name__ == "__main__":
    hydra_main()
