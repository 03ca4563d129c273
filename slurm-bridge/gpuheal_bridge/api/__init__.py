"""The bridge's API models, shared with the operator's client (no FastAPI, no backends).

Import them from their modules: :mod:`gpuheal_bridge.api.models` (requests, responses,
errors) and :mod:`gpuheal_bridge.api.names` (node name and job id grammar).
"""
