"""Two Ray nodes on this machine, one engine worker on each, writing their parts into one shared run directory
(cluster=ray: run.part_writes defaults to workers); the second node is removed once the first batch is back.
Prints the finished run's record.json. Run by tests/test_multinode.py in its own process (a process can hold one
Ray connection, and the test session already has one)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from evalrun.config import load
from evalrun.pipeline.runner import execute, open_for, part_writes, prepare


class RemoveNodeAfterFirstOutcome:
    def __init__(self, inner, cluster: Cluster, node) -> None:
        self.inner, self.cluster, self.node = inner, cluster, node
        self.key, self.stats = inner.key, inner.stats

    def workers(self):
        return self.inner.workers()

    def map(self, batches, generator, scoring=None, sink=None):
        for number, outcome in enumerate(self.inner.map(batches, generator, scoring, sink)):
            if number == 0:
                self.cluster.remove_node(self.node)
            self.stats = self.inner.stats
            yield outcome

    def close(self) -> None:
        self.inner.close()


def main(root: Path, overrides: list[str]) -> None:
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    second = cluster.add_node(num_cpus=1)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    config = load(
        ["cluster=ray", f"cluster.address={cluster.address}", "cluster.num_workers=2",
         "cluster.worker_start_timeout_s=300", f"run.root={root}", "run.progress=false", *overrides]
    )  # fmt: skip
    prepared = prepare(config)
    dispatcher = open_for(prepared)
    hosts = {w["worker"] for w in dispatcher.workers()}
    run = execute(prepared, RemoveNodeAfterFirstOutcome(dispatcher, cluster, second))
    dispatcher.close()
    record = json.loads((run / "record.json").read_text())
    print(json.dumps({"run": str(run), "record": record, "workers": sorted(hosts), "part_writes": part_writes(config)}))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
