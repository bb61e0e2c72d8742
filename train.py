"""The command researchers type: `python train.py [group=option ...] [key=value ...]` (see --help)."""

import hydra

from raydra.entry import main as run
from raydra.schema import register_schemas

register_schemas()


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg):
    return run(cfg)


if __name__ == "__main__":
    main()
