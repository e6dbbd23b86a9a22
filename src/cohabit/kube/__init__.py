"""Run on Kubernetes: the ModelDeployment CRD, the placement operator and the node agent.

Pure pieces (crd, fleetview, resources, podstatus) never touch a cluster; `cluster.py` is the
one adapter over the official client; `operator.py` and `agent.py` are the thin shells.
"""
