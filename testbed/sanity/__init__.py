"""`testbed sanity`: a conformance suite for any DRA kubelet plugin (what csi-sanity is for CSI)."""
