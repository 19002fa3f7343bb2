"""dra-testbed: the Kubernetes-facing side of the testbed and its orchestration."""
