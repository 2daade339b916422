module toposerve.io/cni-forwarder

go 1.22
