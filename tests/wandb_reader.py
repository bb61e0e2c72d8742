"""Reads `.wandb` files with W&B's own record reader and prints what they hold as JSON: run as a
script by tests/helpers.py's `wandb_segments`, with wandb 0.29.0 (`make install` puts it apart, in
.venv/wandb-0.29-reader) first on the path. wandb 0.31, which raydra runs, no longer ships a reader;
0.29.0's `wandb.sdk.internal.datastore.DataStore` reads the same files.

    python tests/wandb_reader.py FILE...  ->  [{"file", "start", "run": {id, name, group, job_type, ...},
                                                "history": [{key: value}], "summary": {key: value},
                                                "config": [keys], "exit_code", "artifacts": [...]}]
"""

import json
import sys

from wandb.proto import wandb_internal_pb2
from wandb.sdk.internal import datastore


def read(path: str) -> dict:
    store = datastore.DataStore()
    store.open_for_scan(path)
    found = {"file": path, "start": None, "run": {}, "history": [], "summary": {}, "config": [], "exit_code": None, "artifacts": []}
    while True:
        try:
            data = store.scan_data()
        except AssertionError:  # a record its writer did not finish: the file ends there
            break
        if data is None:
            break
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found["start"] = record.run.start_time.seconds + record.run.start_time.nanos / 1e9
            found["run"] = {"id": record.run.run_id, "name": record.run.display_name, "group": record.run.run_group}
            found["run"].update(job_type=record.run.job_type, project=record.run.project, tags=list(record.run.tags))
            found["config"] += [u.key for u in record.run.config.update]
        elif kind == "config":
            found["config"] += [u.key for u in record.config.update]
        elif kind == "history":
            found["history"].append({_key(i): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            found["summary"].update({_key(u): json.loads(u.value_json) for u in record.summary.update})
        elif kind == "exit":
            found["exit_code"] = record.exit.exit_code
        elif kind == "artifact":
            found["artifacts"].append(
                {"name": record.artifact.name, "type": record.artifact.type, "aliases": list(record.artifact.aliases)}
            )
    return found


def _key(item) -> str:
    return item.key or ".".join(item.nested_key)


if __name__ == "__main__":
    print(json.dumps([read(path) for path in sys.argv[1:]]))
