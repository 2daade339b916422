// The scheduler's DRA Filter for one node, measured alone: the 1.37.2
// allocator (k8s.io/dynamic-resource-allocation/structured, as
// kube-scheduler's DynamicResources plugin calls it) allocating a one-GPU
// claim on each of 200 nodes, on nodes with free GPUs and on nodes whose
// GPUs are all allocated, with the GPU driver's slice alone and beside each
// NIC slice shape given. CPU time (the process's user + system, collector
// included) per Allocate call, so a loaded machine inflates it less than it
// would wall time.
//
// Input (bench/dra_alloc_cost.py writes it): {"gpu": [devices],
// "shapes": {"name": [NIC devices], ...}}, devices as resource.k8s.io/v1
// ResourceSlice devices (what `driver simulate` publishes for one node).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
)

const (
	gpuDriver = "gpu.toposerve.io"
	nicDriver = "net.toposerve.io"
	nodes     = 200
)

type input struct {
	GPU    []resourceapi.Device            `json:"gpu"`
	Shapes map[string][]resourceapi.Device `json:"shapes"`
}

type classes map[string]*resourceapi.DeviceClass

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if x, ok := c[name]; ok {
		return x, nil
	}
	return nil, fmt.Errorf("no DeviceClass %s", name)
}

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(c))
	for _, x := range c {
		out = append(out, x)
	}
	return out, nil
}

func slice(driver, node string, devices []resourceapi.Device) *resourceapi.ResourceSlice {
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + driver},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node), Devices: devices,
			Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}
}

// cpu is the process's CPU time so far.
func cpu() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// perNode is the CPU time of one Allocate call, over rounds of every node.
func perNode(in input, nic []resourceapi.Device, full bool, rounds int) time.Duration {
	ctx := context.Background()
	// the scale runs' class for whole GPUs (localcluster/scale/workload.py)
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "scale-gpu"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: "device.driver == 'gpu.toposerve.io' && device.attributes['gpu.toposerve.io'].type == 'gpu'"}}}}}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: "default", UID: "u"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "scale-gpu",
				AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}}}}
	var slices []*resourceapi.ResourceSlice
	var nodeObjs []*v1.Node
	allocated := sets.New[structured.DeviceID]()
	for i := range nodes {
		name := fmt.Sprintf("node-%03d", i)
		nodeObjs = append(nodeObjs, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
		slices = append(slices, slice(gpuDriver, name, in.GPU))
		if nic != nil {
			slices = append(slices, slice(nicDriver, name, nic))
		}
		if full {
			for _, d := range in.GPU {
				allocated.Insert(structured.MakeDeviceID(gpuDriver, name, d.Name))
			}
		}
	}
	state := structured.AllocatedState{AllocatedDevices: allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection()}
	// the allocator 1.37.2's default gates pick (incubating), as in kube-scheduler
	features := structured.Features{AdminAccess: true, ConsumableCapacity: true, DeviceBindingAndStatus: true,
		DeviceTaints: true, FractionalCapacityRange: true, PartitionableDevices: true, PrioritizedList: true}
	alloc, err := structured.NewAllocator(ctx, features, state, classes{"scale-gpu": class}, slices,
		cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}))
	if err != nil {
		panic(err)
	}
	claims := []*resourceapi.ResourceClaim{claim}
	for _, n := range nodeObjs { // warm: the CEL cache and the allocator's first maps
		if _, err := alloc.Allocate(ctx, n, claims); err != nil {
			panic(err)
		}
	}
	t0 := cpu()
	for range rounds {
		for _, n := range nodeObjs {
			got, err := alloc.Allocate(ctx, n, claims)
			if err != nil {
				panic(err)
			}
			if (len(got) == 0) != full {
				panic(fmt.Sprintf("node %s: allocated %d claims with full=%v", n.Name, len(got), full))
			}
		}
	}
	return (cpu() - t0) / time.Duration(rounds*nodes)
}

func main() {
	rounds := flag.Int("rounds", 60, "passes over the 200 nodes per shape")
	flag.Parse()
	raw, err := os.ReadFile(flag.Arg(0))
	if err != nil {
		panic(err)
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		panic(err)
	}
	names := make([]string, 0, len(in.Shapes))
	for name := range in.Shapes {
		names = append(names, name)
	}
	sort.Strings(names)
	out := map[string]map[string]float64{}
	for _, name := range append([]string{""}, names...) {
		row := map[string]float64{}
		for _, full := range []bool{false, true} {
			key := map[bool]string{false: "free", true: "full"}[full]
			row[key] = float64(perNode(in, in.Shapes[name], full, *rounds).Nanoseconds()) / 1000
		}
		out[name] = row
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		panic(err)
	}
}
