"""The GPU DRA driver ``gpu.toposerve.io`` on the framework
(``toposerve.dra_driver.kubeletplugin``, ``toposerve.dra_driver.resourceslice``)."""
