"""The operator's service layer: signals in (`sources`, `intake`), incidents driven step by
step (`driver`, `steps`, `record`), policy and pool status out (`report`). It asks
`gpuheal.policy` for every decision and `gpuheal.adapters` for every call to the world."""
