"""What is there: nodes, GPUs, MIG partitions and memory pools, their classes, and the
adapters that discover them (NVML, amdsmi, sysctl, host memory, Kubernetes labels)."""
