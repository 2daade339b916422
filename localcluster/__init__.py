"""Local clusters for development, tests and scale runs: real etcd,
kube-apiserver, controller-manager and scheduler with kwok fake nodes
(``cluster``), a real kubelet + containerd node (``realnode``), the scale
runner and its report (``scale``), and the writer of measurement output
(``results``) that the scale report and the benchmarks share."""
