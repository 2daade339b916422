"""A node's place written by hand (a static router endpoint, a simulated
model server) rather than read from node labels, checked so that it can
be compared with others."""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

from toposerve.topology.model import DomainPath, Tier


class NodePlace(BaseModel):
    """Fields of a config section: the node and the domains it sits in."""


    node: str | None = Field(default=None, description="the node it runs on")
    nvlink_domain: str | None = Field(default=None, alias="nvlinkDomain",
                                      description="its node's NVLink domain (needs node)")
    rack: str | None = Field(default=None, description="its node's rack (needs node)")
    block: str | None = Field(default=None, description="its node's block (needs node)")
    zone: str | None = Field(default=None, description="its node's zone (needs node)")

    @model_validator(mode="after")
    def _whole_place(self) -> NodePlace:
        if self.node is None and any((self.nvlink_domain, self.rack, self.block, self.zone)):
            raise ValueError(f"{self.spelled('nvlink_domain')}, {self.spelled('rack')}, "
                             f"{self.spelled('block')} and {self.spelled('zone')} say where "
                             f"a node sits: set {self.spelled('node')} too")
        if self.path is not None and (gaps := self.path.gaps()):
            *rest, last = [self.spelled("nvlink_domain" if t is Tier.NVLINK else t.name.lower())
                           for t in gaps]
            missing = f"{', '.join(rest)} and {last}" if rest else last
            raise ValueError(f"set {missing} too: places are compared from the zone inwards, "
                             "so a level inside an unknown one is never shared (any names "
                             "will do, one value for the whole fleet if it has a single zone "
                             "or block)")
        return self

    @classmethod
    def spelled(cls, field: str) -> str:
        """How the section's users spell ``field``: its YAML key here, a
        flag where a command line fills the section."""
        return cls.model_fields[field].alias or field

    @property
    def path(self) -> DomainPath | None:
        """Its node's place in the shared topology model."""
        if self.node is None:
            return None
        return DomainPath(zone=self.zone, block=self.block, rack=self.rack,
                          nvlink=self.nvlink_domain, host=self.node)
