"""The OpenAI-compatible gateway: what it accepts of a request (`intake`), the route table
(`routing`), the engine connections (`upstream`), the proxy itself (`proxy`) and the traffic
it counts (`activity`). It asks the control loop to load a deployment through `proxy.Loader`
only."""
