"""toposerve: topology-aware serving for large-model inference on Kubernetes.

The one import name of the wheel. Its subpackages are the parts (``router``,
``dra_driver``, ``scheduler_ext``, ``simulator``) over the shared ground
(``topology``, ``kubeapi``, ``wire``, ``serving``), with the install
(``manifests``) and the local cluster (``localcluster``) above them; this
package's own modules are the ``toposerve`` command line (``main`` and a
``*_cmd`` module a subcommand).
"""
