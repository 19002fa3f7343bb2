"""The local control plane: binaries, PKI, and etcd + kube-apiserver + KCM + scheduler
run as processes on 127.0.0.1."""
