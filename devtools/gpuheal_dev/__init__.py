"""gpuheal development tooling (never shipped): the local sandbox, the demo, its training job
and the incident timeline plots."""
