"""`gpuheal agent`: the node agent that turns the kernel log (and NVML, where present) into what
the operator consumes: Node Events (reason `GpuXid`, message = the driver's line, exactly the
form of `gpuheal simulate xid` and node-problem-detector's kernel monitor), a node condition
`GpuXid`, and the node's GPU identity map (annotation `gpuheal.io/gpus`).

Layout:
  records.py  kernel-log records from /dev/kmsg or a text log (dmesg, dmesg -T, journalctl -k)
  detect.py   pure: records -> findings -> one Event per fault series (counts, not floods),
              the condition, the restart state
  nvml.py     optional NVML probe (nvidia-ml-py, imported lazily): UUIDs, ECC, row remapping,
              retired pages, GPU count
  kube.py     the only module that talks to the API server (kubernetes_asyncio)
  run.py      the loop and the `gpuheal agent` command line

No kopf, no operator modules: the agent runs on every GPU node and stays small.
"""
