"""kopf's side of the operator: decorators only. Each handler parses what kopf hands it and
passes it to `gpuheal.remediation`; `run` starts kopf with them registered."""
