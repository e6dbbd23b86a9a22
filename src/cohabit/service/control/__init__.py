"""The control loop: admission (`admission`), the reconciler that drives each deployment through
its lifecycle, and what it decides beside that — copies, making room (preemption and the
queue), autoscaling, idle unload and durations, the over-budget policy, retention — and the
timeline those steps write. It reads the gateway's traffic through `signals.Signals` only."""
