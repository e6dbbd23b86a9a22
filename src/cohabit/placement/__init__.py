"""Where a deployment goes — pure: no I/O, no clock.

`plan(state, request)` decides one request against an immutable `FleetState`;
`plan_online()` and `plan_batch()` decide many. Outcomes are values: `Placement` or `NoFit`.
"""
