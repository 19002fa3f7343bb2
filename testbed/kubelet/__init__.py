"""The fake kubelet for synthetic nodes. It speaks to DRA drivers only through the
gRPC a real kubelet uses, over the node's real unix sockets."""
