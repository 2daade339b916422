"""DRA kubelet plugins for accelerators and NICs (later issues)."""
