"""The memory baseline: a plain kopf operator with one ``@kopf.on.event('nodes')`` handler
that keeps nothing (kopf still lists, parses and hands over every full Node body).

``KUBECONFIG=... BENCH_EXPECT_NODES=1000 python -m bench.kopf_baseline``; prints
``baseline: saw N nodes`` once it has handled an event for ``BENCH_EXPECT_NODES`` nodes.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import kopf

EXPECT = int(os.environ.get("BENCH_EXPECT_NODES", "0"))
_seen: set[str] = set()
_t0 = time.monotonic()


@kopf.on.login()
def login(**kwargs: Any) -> Any:
    return kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    settings.posting.level = logging.WARNING


@kopf.on.event("", "v1", "nodes")
def node_event(name: str | None, **_: Any) -> None:
    if name and name not in _seen:
        _seen.add(name)
        if len(_seen) == EXPECT:
            print(f"baseline: saw {EXPECT} nodes after {time.monotonic() - _t0:.2f} s", flush=True)


def main() -> None:
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.configure(verbose=False)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(clusterwide=True, standalone=True)


if __name__ == "__main__":
    main()
