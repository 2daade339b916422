"""A real local Kubernetes cluster (etcd, kube-apiserver, controller-manager,
scheduler) with kwok fake nodes."""
