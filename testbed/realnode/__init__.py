"""Real-kubelet nodes: the upstream kubelet, a fake CRI runtime and a driver process per node."""
