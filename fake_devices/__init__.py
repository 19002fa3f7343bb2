"""Emulated hardware (GPUs, NICs, topology, partitions, faults) and the Ray actors that
hold it. Nothing in this package knows about Kubernetes."""
