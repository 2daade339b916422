"""How many accelerators a claim's device requests ask for, read as the DRA
allocator reads them: a request (or a ``firstAvailable`` subrequest) asks
for accelerators when its DeviceClass's selectors and its own pick devices
of an accelerator driver, whatever the class is called.

Selectors are CEL, evaluated (``cel-python``) with Kubernetes' DRA surface
(``device.driver``, ``device.attributes[domain].name``,
``device.capacity[domain].name``, ``device.allowMultipleAllocations``, the
``quantity`` and ``semver`` libraries) against the **shapes** of the
accelerator devices in the watched ResourceSlices: a device without the
attributes that name one device or its place (uuid, PCI address, index,
NUMA node, topology place), so a cluster of thousands of GPUs has a handful
of shapes. A node is reduced to its **profile** (per accelerator unit, the
shapes of its devices), so ``allocationMode: All`` counts the matching units
of the largest node without a pass over the nodes.

A request asking ``capacity.requests.memory`` of devices that all allow
multiple allocations (DRA consumable capacity) asks a **share**, not a
unit: its bytes, rounded up as the devices' request policy rounds them, are
counted apart (``Evaluated.shares``; ``placement.shares`` fits them).

What cannot be decided (a selector that does not compile, calls a function
we lack, fails at run time or reads a device's identity; a DeviceClass not
seen) counts as accelerators when an accelerator driver (or a configured
class) is named in it, else not; either way the pod's decisions say so.

A pod may also ask a DeviceClass by an extended resource name in its
containers' resources (DRAExtendedResource, GA in Kubernetes 1.37): the
class's ``spec.extendedResourceName`` or its implicit
``deviceclass.resource.kubernetes.io/<class>``. Until the scheduler has made
its claim, such a request counts as a claim of that class for that many
devices (``extended_demand``)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes
from celpy.celparser import CELParseError
from celpy.evaluation import CELEvalError, CELSyntaxError, CELUnsupportedError

from toposerve.scheduler_ext.placement.shares import round_up

# the API's own limits (a claim holds at most 32 requests of at most 8
# subrequests, an expression at most 10 KiB): more is not evaluated
MAX_REQUESTS = 32
MAX_SUBREQUESTS = 8
MAX_SELECTORS = 32
MAX_EXPRESSION = 10 * 1024
MAX_PROGRAMS = 1024  # compiled expressions kept, by text
MAX_MEMO = 4096  # evaluated request lists kept
# attributes that name one device or where it is: left out of a device's shape
IDENTITY = frozenset({"uuid", "parentUUID", "pciBusID", "pcieRoot", "pcieSwitch", "index",
                      "minor", "numaNode", "placementStart", "zone", "block", "rack",
                      "nvlinkDomain"})


@dataclass(frozen=True)
class Alternative:
    """One way to satisfy a request: ``count`` devices of a class, or ``All``."""

    device_class: str
    selectors: tuple[str, ...]
    all: bool
    count: int
    memory: int | None = None  # capacity.requests.memory in bytes, if asked


def _memory(spec: dict[str, Any]) -> int | None:
    asked = ((spec.get("capacity") or {}).get("requests") or {}).get("memory")
    if asked is None:
        return None
    try:
        got = parse_quantity(str(asked)).value
    except CelError:
        return None  # the apiserver admits no such claim; counted as a whole unit
    return max(0, math.ceil(got))


Request = tuple[Alternative, ...]  # one, or a prioritized list (firstAvailable)


def _alternative(spec: dict[str, Any]) -> Alternative:
    sels = tuple(str((s.get("cel") or {}).get("expression") or "")
                 for s in (spec.get("selectors") or [])[:MAX_SELECTORS])
    return Alternative(str(spec.get("deviceClassName") or ""), sels,
                       spec.get("allocationMode") == "All", int(spec.get("count") or 1),
                       _memory(spec))


# a DeviceClass serves pods asking this prefix and its name, whatever else it says
IMPLICIT_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"


def resource_classes(classes: Mapping[str, tuple[str | None, str]]) -> dict[str, str]:
    """Extended resource name -> the DeviceClass serving it, as the
    scheduler resolves them, from class name -> (``spec.extendedResourceName``,
    ``metadata.creationTimestamp``): each class by its implicit name, and by
    its explicit one; where two classes name one resource, the newer wins,
    then the lower name (the way a site migrates from one class to another)."""
    out = {f"{IMPLICIT_RESOURCE_PREFIX}{name}": name for name in classes}
    # ascending age, names descending within one timestamp: the last write wins
    ordered = sorted(classes.items(), key=lambda kv: kv[0], reverse=True)
    ordered.sort(key=lambda kv: kv[1][1])
    for name, (explicit, _) in ordered:
        if explicit:
            out[explicit] = name
    return out


def extended_demand(asked: Sequence[tuple[str, int]], classes: Mapping[str, str],
                    device_plugin: Collection[str], *, bound: bool, by_claim: Collection[str],
                    claim_seen: bool) -> tuple[int, tuple[Request, ...]]:
    """A pod's extended resources (``asked``: name, count) as the extender
    counts them: (devices a device plugin serves, requests standing for the
    claim the scheduler makes). A name a DeviceClass serves (``classes``,
    ``resource_classes``) counts as a claim of that class for that many
    devices until the pod is bound, or, for a name its claim serves
    (``by_claim``: the pod's ``status.extendedResourceClaimStatus``), until
    that claim is seen (then it counts as itself). A bound pod without a
    claim for a name got it from a device plugin (the scheduler serves a
    name by DRA only on a node whose allocatable lacks it): counted when
    configured (``device_plugin``)."""
    plugin = 0
    requests: list[Request] = []
    for name, count in asked:
        cls = classes.get(name)
        if name in by_claim:
            if not claim_seen and cls is not None:
                requests.append((Alternative(cls, (), False, count),))
        elif cls is not None and not bound:
            requests.append((Alternative(cls, (), False, count),))
        elif name in device_plugin:
            plugin += count
    return plugin, tuple(requests)


def parse_requests(raw: list[dict[str, Any]]) -> tuple[Request, ...]:
    """A claim's ``spec.devices.requests`` (v1: ``exactly`` or
    ``firstAvailable``; v1beta1: the fields on the request itself)."""
    out = []
    for r in raw[:MAX_REQUESTS]:
        if r.get("firstAvailable"):
            out.append(tuple(_alternative(s) for s in r["firstAvailable"][:MAX_SUBREQUESTS]))
        elif not (spec := r.get("exactly") or r).get("adminAccess"):
            out.append((_alternative(spec),))
        # admin access (a monitor's claim) takes no device from anyone: the
        # scheduler gives it devices in use and never counts them as used
    return tuple(out)


# --- the Kubernetes CEL libraries used on devices ------------------------------------

_SUFFIX = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000),
           "": Fraction(1), "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
           "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
           "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30),
           "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60)}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))"
                       r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?)$")
_SEMVER = re.compile(r"^v?(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
                     r"(?:-([0-9A-Za-z.-]+))?(?:\+[0-9A-Za-z.-]+)?$")


class CelError(ValueError):
    pass


@dataclass(frozen=True, order=True)
class Quantity:
    value: Fraction


@dataclass(frozen=True)
class Semver:
    core: tuple[int, int, int]
    pre: str

    def key(self) -> tuple[tuple[int, int, int], int, tuple[tuple[int, int | str], ...]]:
        # a pre-release sorts before its release; numeric identifiers before others
        parts = tuple((0, int(p)) if p.isdigit() else (1, p) for p in self.pre.split(".")) \
            if self.pre else ()
        return self.core, 0 if self.pre else 1, parts


def parse_quantity(text: str) -> Quantity:
    m = _QUANTITY.match(str(text))
    if not m:
        raise CelError(f"{text!r} is not a quantity")
    exp = Fraction(10) ** int(m.group(2)[1:]) if m.group(2) else _SUFFIX[m.group(3) or ""]
    return Quantity(Fraction(m.group(1)) * exp)


def parse_semver(text: str) -> Semver:
    m = _SEMVER.match(str(text))
    if not m:
        raise CelError(f"{text!r} is not a semantic version")
    return Semver((int(m.group(1)), int(m.group(2)), int(m.group(3))), m.group(4) or "")


def _is(parse: Callable[[str], object]) -> Callable[[Any], celtypes.BoolType]:
    def check(text: Any) -> celtypes.BoolType:
        try:
            parse(str(text))
        except CelError:
            return celtypes.BoolType(False)
        return celtypes.BoolType(True)
    return check


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, Quantity) and isinstance(b, Quantity):
        return (a.value > b.value) - (a.value < b.value)
    if isinstance(a, Semver) and isinstance(b, Semver):
        return (a.key() > b.key()) - (a.key() < b.key())
    raise CelError(f"cannot compare {type(a).__name__} with {type(b).__name__}")


def _quantity_op(op: Callable[[Fraction, Fraction], Fraction]) -> Callable[[Any, Any], Quantity]:
    def run(a: Any, b: Any) -> Quantity:
        if not isinstance(a, Quantity):
            raise CelError("not a quantity")
        return Quantity(op(a.value, b.value if isinstance(b, Quantity) else Fraction(int(b))))
    return run


def _field(kind: type, get: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def run(x: Any) -> Any:
        if not isinstance(x, kind):
            raise CelError(f"not a {kind.__name__}")
        return get(x)
    return run


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": parse_quantity, "isQuantity": _is(parse_quantity),
    "semver": parse_semver, "isSemver": _is(parse_semver),
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "add": _quantity_op(lambda x, y: x + y), "sub": _quantity_op(lambda x, y: x - y),
    "sign": _field(Quantity, lambda q: celtypes.IntType((q.value > 0) - (q.value < 0))),
    "isInteger": _field(Quantity, lambda q: celtypes.BoolType(q.value.denominator == 1)),
    "asInteger": _field(Quantity, lambda q: celtypes.IntType(int(q.value))),
    "asApproximateFloat": _field(Quantity, lambda q: celtypes.DoubleType(float(q.value))),
    "major": _field(Semver, lambda v: celtypes.IntType(v.core[0])),
    "minor": _field(Semver, lambda v: celtypes.IntType(v.core[1])),
    "patch": _field(Semver, lambda v: celtypes.IntType(v.core[2])),
}


# --- devices ------------------------------------------------------------------------

@dataclass(frozen=True)
class DeviceShape:
    """A device as selectors may see it, without its identity (``IDENTITY``)."""

    driver: str
    # as the slice writes them (a name without a domain is in the driver's):
    # devices of one driver list them in one order, so alike devices are equal
    attributes: tuple[tuple[str, str, Any], ...]  # (name, type, value)
    capacity: tuple[tuple[str, str], ...]  # (name, quantity)
    multiple: bool
    # a shareable device's memory policy: (validRange.min, .step) in bytes
    memory_policy: tuple[int, int] | None = None


def _qualified(driver: str, name: str) -> tuple[str, str]:
    domain, _, short = name.rpartition("/")
    return (domain or driver, short)


_SHAPES: dict[DeviceShape, DeviceShape] = {}  # one object per shape: thousands of devices share it


_KEPT: dict[str, bool] = {}  # attribute name -> not an identity (few names, many devices)


def device_shape(driver: str, device: dict[str, Any]) -> DeviceShape:
    """Cheap: every device of every slice goes through it (80 an HGX node)."""
    attrs = []
    for name, value in (device.get("attributes") or {}).items():
        kept = _KEPT.get(name)
        if kept is None:
            if len(_KEPT) >= MAX_MEMO:
                _KEPT.clear()
            kept = _KEPT[name] = name.rpartition("/")[2] not in IDENTITY
        if kept and type(value) is dict:
            for kind, v in value.items():  # one typed value: {"string": "x"}
                attrs.append((name, kind, v))
    caps = tuple((name, str((c or {}).get("value", "0")))
                 for name, c in (device.get("capacity") or {}).items())
    multiple = bool(device.get("allowMultipleAllocations"))
    shape = DeviceShape(driver, tuple(attrs), caps, multiple,
                        _memory_policy(device) if multiple else None)
    if len(_SHAPES) >= MAX_MEMO:
        _SHAPES.clear()
    return _SHAPES.setdefault(shape, shape)


def _memory_policy(device: dict[str, Any]) -> tuple[int, int] | None:
    memory = (device.get("capacity") or {}).get("memory") or {}
    valid = (memory.get("requestPolicy") or {}).get("validRange") or {}
    try:
        least = parse_quantity(str(valid["min"])).value if "min" in valid else Fraction(0)
        step = parse_quantity(str(valid["step"])).value if "step" in valid else Fraction(0)
    except CelError:
        return None
    return int(least), int(step)


def share_bytes(shape: DeviceShape) -> int | None:
    """A shareable device's memory in bytes (None: not shareable by memory)."""
    if not shape.multiple:
        return None
    text = dict(shape.capacity).get("memory")
    try:
        return None if text is None else int(parse_quantity(text).value)
    except CelError:
        return None


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: a domain without entries
    is an empty map, as in Kubernetes (a missing name is still an error)."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType()


_VALUE: dict[str, Callable[[Any], Any]] = {
    "string": celtypes.StringType, "int": celtypes.IntType, "bool": celtypes.BoolType,
    "version": parse_semver}


def _activation(shape: DeviceShape) -> dict[str, Any]:
    S = celtypes.StringType
    attrs: dict[Any, Any] = {}
    for qualified, kind, value in shape.attributes:
        domain, name = _qualified(shape.driver, qualified)
        try:
            attrs.setdefault(S(domain), celtypes.MapType())[S(name)] = _VALUE[kind](value)
        except (KeyError, CelError):
            continue  # a type or value we cannot read: as if the device did not have it
    caps: dict[Any, Any] = {}
    for qualified, text in shape.capacity:
        domain, name = _qualified(shape.driver, qualified)
        try:
            caps.setdefault(S(domain), celtypes.MapType())[S(name)] = parse_quantity(text)
        except CelError:
            continue
    return {"device": celtypes.MapType({
        S("driver"): S(shape.driver), S("attributes"): _Domains(attrs),
        S("capacity"): _Domains(caps),
        S("allowMultipleAllocations"): celtypes.BoolType(shape.multiple)})}


# a node's accelerators: per unit, the shapes of its devices (a GPU and its
# partitions share one unit), as (shapes, units) pairs
Profile = frozenset[tuple[frozenset[DeviceShape], int]]


def profile(units: Iterable[tuple[str, DeviceShape]]) -> Profile:
    """The profile of a node from its (unit, device shape) pairs."""
    of: dict[str, set[DeviceShape]] = {}
    for unit, shape in units:
        of.setdefault(unit, set()).add(shape)
    return frozenset(Counter(frozenset(s) for s in of.values()).items())


# --- evaluation ---------------------------------------------------------------------

@dataclass(frozen=True)
class Evaluated:
    count: int
    notes: tuple[str, ...] = ()  # what could not be decided, and how it was counted
    shares: tuple[int, ...] = ()  # bytes of each memory share asked, as consumed


_NONE = Evaluated(0)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class _Outcome:
    count: int
    satisfiable: bool | None  # None: it asks for no accelerator, or is undecided
    note: str | None = None
    shares: tuple[int, ...] = ()


class Demands:
    """Accelerators asked by request lists, against the DeviceClasses and the
    node profiles seen. Not thread-safe: the cache calls it under its lock.
    ``generation`` moves whenever an answer may have changed."""

    def __init__(self, drivers: Iterable[str], classes: Iterable[str]) -> None:
        self.drivers = frozenset(drivers)
        # counted as all accelerators while their DeviceClass is not seen
        self.configured = frozenset(classes)
        self.classes: dict[str, tuple[str, ...]] = {}
        # class -> (its spec.extendedResourceName, creationTimestamp)
        self._ext_names: dict[str, tuple[str | None, str]] = {}
        self.resources: dict[str, str] = {}  # extended resource name -> class
        self.profiles: Counter[Profile] = Counter()
        self.generation = 0
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}  # text -> program, or why there is none
        self._memo: dict[tuple[Request, ...], Evaluated] = {}
        self._matched: dict[tuple[str, ...], frozenset[DeviceShape] | str] = {}
        self._activations: dict[DeviceShape, dict[str, Any]] = {}

    def _moved(self) -> None:
        self.generation += 1
        self._memo.clear()
        self._matched.clear()

    def set_class(self, name: str, obj: dict[str, Any] | None) -> None:
        """A DeviceClass seen (``obj``) or gone (``None``)."""
        if obj is None:
            if name not in self.classes:
                return
            del self.classes[name]
            self._ext_names.pop(name, None)
        else:
            spec = obj.get("spec") or {}
            sels = tuple(str((s.get("cel") or {}).get("expression") or "")
                         for s in (spec.get("selectors") or [])[:MAX_SELECTORS])
            named = (spec.get("extendedResourceName") or None,
                     str((obj.get("metadata") or {}).get("creationTimestamp") or ""))
            if self.classes.get(name) == sels and self._ext_names.get(name) == named:
                return
            self.classes[name] = sels
            self._ext_names[name] = named
        self.resources = resource_classes(self._ext_names)
        self._moved()

    def move_profile(self, old: Profile | None, new: Profile | None) -> None:
        """A node's profile went from ``old`` to ``new``."""
        if old == new:
            return
        changed = False  # a profile appeared or went: the answers may move
        if old:
            self.profiles[old] -= 1
            if self.profiles[old] <= 0:
                del self.profiles[old]
                self._activations = {}  # drop shapes no node has any more
                changed = True
        if new:
            self.profiles[new] += 1
            changed = changed or self.profiles[new] == 1
        if changed:
            self._moved()

    def share_unit(self) -> int:
        """Bytes of the smallest shareable device any node has (0: none)."""
        return min((b for p in self.profiles for shapes, _ in p for s in shapes
                    if (b := share_bytes(s)) is not None), default=0)

    def evaluate(self, requests: tuple[Request, ...]) -> Evaluated:
        got = self._memo.get(requests)
        if got is None:
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
            got = self._memo[requests] = self._evaluate(requests)
        return got

    def _evaluate(self, requests: tuple[Request, ...]) -> Evaluated:
        if not requests:
            return _NONE
        total, notes, shares = 0, [], list[int]()
        for alternatives in requests:
            outcomes = [self._alternative(a) for a in alternatives]
            notes += [o.note for o in outcomes if o.note]
            chosen = self._first_available(outcomes)
            total += chosen.count
            shares += chosen.shares
        return Evaluated(total, tuple(dict.fromkeys(notes)), tuple(shares))

    @staticmethod
    def _first_available(outcomes: list[_Outcome]) -> _Outcome:
        """The first subrequest some node could satisfy; where one before it
        is undecided or asks for other devices (some node may have them), or
        where none could, the smallest (never more than the allocator may take)."""
        for o in outcomes:
            if o.satisfiable is None:
                break
            if o.satisfiable:
                return o
        return min(outcomes, key=lambda o: (o.count, sum(o.shares)))

    def _alternative(self, alt: Alternative) -> _Outcome:
        class_sels = self.classes.get(alt.device_class)
        if class_sels is None:
            if alt.device_class not in self.configured:
                return self._undecided(alt, (alt.device_class, *alt.selectors),
                                       f"DeviceClass {alt.device_class!r} not seen")
            class_sels = ()  # a configured class: every accelerator device
        exprs = (*class_sels, *alt.selectors)
        matched = self._match(exprs)
        if isinstance(matched, str):
            return self._undecided(alt, (alt.device_class, *exprs), matched)
        if not matched:
            # naming our driver, it asks for accelerators that no node has; else
            # it asks for other devices, which some node may have
            return _Outcome(0, False if self._named((alt.device_class, *exprs)) else None)
        if alt.memory is not None and not alt.all and all(s.multiple for s in matched):
            return self._share(alt, alt.memory, matched)
        units = [sum(n for shapes, n in p if shapes & matched) for p in self.profiles]
        most = max(units, default=0)
        if alt.all:
            return _Outcome(most, most > 0)
        return _Outcome(alt.count, most >= alt.count)

    @staticmethod
    def _share(alt: Alternative, memory: int, matched: frozenset[DeviceShape]) -> _Outcome:
        """``count`` shares of ``memory`` bytes, each rounded up as the
        strictest policy among the devices picked rounds it (what the
        allocator records as consumed); satisfiable where one device holds it."""
        ask = max(round_up(memory, *(s.memory_policy or (0, 0))) for s in matched)
        biggest = max((share_bytes(s) or 0) for s in matched)
        return _Outcome(0, ask <= biggest, shares=(ask,) * alt.count)

    def _undecided(self, alt: Alternative, texts: tuple[str, ...], why: str) -> _Outcome:
        named = self._named(texts)
        if alt.device_class in self.configured and not named:
            named = [alt.device_class]
        if not named:
            return _Outcome(0, None, f"{why}: not counted as accelerators")
        count = alt.count
        if alt.all:  # every accelerator unit of the largest node
            count = max((sum(n for _, n in p) for p in self.profiles), default=0)
        return _Outcome(count, None, f"{why}: counted as {count} of {named[0]} (named in it)")

    def _named(self, texts: tuple[str, ...]) -> list[str]:
        return sorted(d for d in self.drivers if any(d in t for t in texts))

    def _match(self, exprs: tuple[str, ...]) -> frozenset[DeviceShape] | str:
        """The shapes every expression picks, or why that is not known."""
        got = self._matched.get(exprs)
        if got is not None:
            return got
        shapes = {s for p in self.profiles for group, _ in p for s in group}
        if not shapes:
            got = "no accelerator devices seen yet"
        else:
            got = frozenset(shapes)
            for text in exprs:
                got = self._select(text, got)
                if isinstance(got, str):
                    break
        self._matched[exprs] = got
        return got

    def _select(self, text: str, shapes: frozenset[DeviceShape]) -> frozenset[DeviceShape] | str:
        program = self._program(text)
        if isinstance(program, str):
            return program
        if IDENTITY & set(_IDENT.findall(text)):
            return f"selector {_short(text)} reads a device's identity or place"
        out = set()
        for shape in shapes:
            act = self._activations.get(shape)
            if act is None:
                act = self._activations[shape] = _activation(shape)
            try:
                result = program.evaluate(act)
            except (CELEvalError, CELUnsupportedError, CelError, TypeError, ValueError,
                    KeyError) as err:
                return f"selector {_short(text)} failed: {_reason(err)}"
            if not isinstance(result, celtypes.BoolType):
                return f"selector {_short(text)} failed: {_reason(result)}"
            if result:
                out.add(shape)
        return frozenset(out)

    def _program(self, text: str) -> Any:
        got = self._programs.get(text)
        if got is None:
            if len(self._programs) >= MAX_PROGRAMS:
                self._programs.clear()
            if len(text) > MAX_EXPRESSION:
                got = f"selector {_short(text)} is longer than {MAX_EXPRESSION} characters"
            else:
                try:
                    got = self._env.program(self._env.compile(text), functions=FUNCTIONS)
                except (CELParseError, CELSyntaxError, CELUnsupportedError, ValueError,
                        TypeError) as err:
                    got = f"selector {_short(text)} does not compile: {_reason(err)}"
            self._programs[text] = got
        return got


def _short(text: str) -> str:
    return repr(text if len(text) <= 80 else f"{text[:77]}...")


_UNDECLARED = re.compile(r"undeclared reference to '([^']+)'")


def _reason(err: Any) -> str:
    """One short line (the library's own messages carry its whole activation)."""
    text = str(err.args[0] if getattr(err, "args", None) else err)
    if (m := _UNDECLARED.search(text)) is not None:
        return f"uses {m.group(1)}, which the extender does not have"
    return text.splitlines()[0][:120] if text else type(err).__name__
