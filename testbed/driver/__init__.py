"""The DRA kubelet plugin: registration, DRA v1/v1beta1 and health gRPC services,
ResourceSlice publication, CDI specs, checkpoint, metrics. Runs alone (one node, real
kubelet) or many per process (synthetic nodes)."""
