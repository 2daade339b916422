"""A real local Kubernetes cluster (etcd, apiserver, controller-manager, scheduler) with kwok fake nodes."""
