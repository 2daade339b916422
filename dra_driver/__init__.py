"""DRA drivers for accelerators and NICs. ``kubeletplugin``: the kubelet-plugin framework
(a ``DeviceKind`` plugs in); ``resourceslice``: the ResourceSlice publisher; ``driver_process``
joins them into one process; ``gpu``, ``net``: the drivers; ``simulate``: kwok nodes' slices."""
