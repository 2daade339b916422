"""The GPU DRA driver ``gpu.toposerve.io`` on the framework
(``dra_driver.kubeletplugin``, ``dra_driver.resourceslice``)."""
