"""What the server tells about itself: the memory meter (`meter`), the Prometheus metrics
(`metrics`) and the log format (`logformat`)."""
