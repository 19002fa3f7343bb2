"""A DRA kubelet-plugin framework that knows no kind of device.

Registration, DRA v1/v1beta1 and resource-health v1/v1alpha1 gRPC services (the
registration socket and the DRA socket each served on its own), liveness, claim reads,
checkpoint and repair, CDI specs, ResourceSlice publication within the API's limits,
metrics: the same for every driver. A driver supplies only what ``driver.Driver`` asks
(its devices, their health, preparing and unpreparing one claim); ``plugin.DriverPlugin``
serves one driver for one node, alone (a real node) or many per process (synthetic nodes).
"""
