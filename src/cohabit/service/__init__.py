"""The control plane: the REST API, the catalog of models, admission and the reconciler that
drives each deployment from REQUESTED to DEPLOYED (or to a recorded failure)."""
