"""A local Kubernetes control plane made of real components (etcd, kube-apiserver, controller-manager,
scheduler, kwok) plus Prometheus, built from the package registries and cached under ~/.cache/disagg."""
