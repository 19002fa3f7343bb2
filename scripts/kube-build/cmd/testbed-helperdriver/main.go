// testbed-helperdriver is the yardstick `make bench` holds testbed-driver against: a
// GPU driver of the smallest shape the upstream kubeletplugin helper allows, built as
// the reference drivers are. The helper reads each claim from the API server and
// serves the DRA socket; the driver writes a CDI spec per claim (rename, no fsync)
// and records prepared claims in a checkpoint through the kubelet's own checkpoint
// manager (one fsync per prepare and per unprepare). For the benchmark it publishes no
// slices and registers with no kubelet: it only answers NodePrepareResources and
// NodeUnprepareResources, so the benchmark times the same work on both sides.
//
// With --registrar-dir (a synthetic node's $KUBELET_REGISTRAR_DIRECTORY_PATH, which
// its defaults take from the environment) it is a whole driver as a DaemonSet runs
// one: it registers with the node's kubelet through the helper (rolling-update socket
// names when $POD_UID is set) and, with --gpus N, publishes N GPUs through the
// upstream ResourceSlice controller. The tests run it on the fake kubelet: a driver
// the testbed did not write, on the code driver developers build on.
//
// With --cdi-library it writes its specs as drivers built on the CDI library do
// (dra-example-driver): YAML through the library's own writer, and a spec of one
// "common" device, written at start, that every claim's devices name besides their own.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager"
	"k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum"
	checkpointerrors "k8s.io/kubernetes/pkg/kubelet/checkpointmanager/errors"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const checkpointName = "checkpoint.json"

// preparedClaims is what the checkpoint holds: each prepared claim's CDI device IDs by device.
type preparedClaims struct {
	Claims   map[types.UID]map[string][]string `json:"claims"`
	Checksum checksum.Checksum                 `json:"checksum"`
}

func (c *preparedClaims) MarshalCheckpoint() ([]byte, error) {
	c.Checksum = 0
	c.Checksum = checksum.New(c.Claims)
	return json.Marshal(c)
}

func (c *preparedClaims) UnmarshalCheckpoint(blob []byte) error {
	return json.Unmarshal(blob, c)
}

func (c *preparedClaims) VerifyChecksum() error {
	return c.Checksum.Verify(c.Claims)
}

type driver struct {
	name        string
	cdiDir      string
	cdiLibrary  *cdi.Cache // with --cdi-library: writes the specs
	checkpoints checkpointmanager.CheckpointManager
	mutex       sync.Mutex
	prepared    preparedClaims
}

func (d *driver) specPath(uid types.UID) string {
	return filepath.Join(d.cdiDir, fmt.Sprintf("%s-%s.json", d.name, uid))
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mutex.Lock()
	defer d.mutex.Unlock()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		results[claim.UID] = d.prepare(claim)
	}
	if err := d.checkpoints.CreateCheckpoint(checkpointName, &d.prepared); err != nil {
		return nil, fmt.Errorf("write checkpoint: %w", err)
	}
	return results, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) kubeletplugin.PrepareResult {
	var devices []kubeletplugin.Device
	cdiDevices := []map[string]any{}
	ids := map[string][]string{}
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != d.name {
			continue
		}
		name := fmt.Sprintf("%s-%s", claim.UID, result.Device)
		id := fmt.Sprintf("%s/gpu=%s", d.name, name)
		hash := fnv.New32a()
		_, _ = hash.Write([]byte(result.Device))
		cdiDevices = append(cdiDevices, map[string]any{
			"name":           name,
			"containerEdits": map[string]any{"env": []string{fmt.Sprintf("GPU_DEVICE_%d=%s", hash.Sum32()%1000, result.Device)}},
		})
		ids[result.Device] = []string{id}
		devices = append(devices, kubeletplugin.Device{
			Requests: []string{result.Request}, PoolName: result.Pool, DeviceName: result.Device, CDIDeviceIDs: []string{id},
		})
	}
	spec, _ := json.Marshal(map[string]any{"cdiVersion": "0.6.0", "kind": d.name + "/gpu", "devices": cdiDevices})
	if err := d.writeSpec(claim.UID, spec); err != nil {
		return kubeletplugin.PrepareResult{Err: err}
	}
	if d.cdiLibrary != nil {
		common := d.commonDeviceID()
		for i := range devices {
			devices[i].CDIDeviceIDs = append([]string{common}, devices[i].CDIDeviceIDs...)
		}
	}
	d.prepared.Claims[claim.UID] = ids
	return kubeletplugin.PrepareResult{Devices: devices}
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mutex.Lock()
	defer d.mutex.Unlock()
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		err := d.removeSpec(claim.UID)
		delete(d.prepared.Claims, claim.UID)
		results[claim.UID] = err
	}
	if err := d.checkpoints.CreateCheckpoint(checkpointName, &d.prepared); err != nil {
		return nil, fmt.Errorf("write checkpoint: %w", err)
	}
	return results, nil
}

// WatchHealthStatus: the benchmark times prepares, not health streams.
func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d *driver) HandleError(_ context.Context, err error, msg string) {
	fmt.Fprintf(os.Stderr, "testbed-helperdriver: %s: %v\n", msg, err)
}

// writeRenamed writes a file whole or not at all (a temporary renamed into place).
func writeRenamed(path string, data []byte) error {
	temporary := path + ".tmp"
	if err := os.WriteFile(temporary, data, 0o644); err != nil {
		return err
	}
	return os.Rename(temporary, path)
}

func (d *driver) writeSpec(uid types.UID, spec []byte) error {
	if d.cdiLibrary == nil {
		return writeRenamed(d.specPath(uid), spec)
	}
	var raw cdispec.Spec
	if err := json.Unmarshal(spec, &raw); err != nil {
		return err
	}
	return d.cdiLibrary.WriteSpec(&raw, d.libraryName(uid))
}

// libraryName is a claim's spec file under --cdi-library.
func (d *driver) libraryName(uid types.UID) string { return fmt.Sprintf("%s-%s.yaml", d.name, uid) }

func (d *driver) removeSpec(uid types.UID) error {
	var err error
	if d.cdiLibrary == nil {
		err = os.Remove(d.specPath(uid))
	} else {
		err = d.cdiLibrary.RemoveSpec(d.libraryName(uid))
	}
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return err
}

func (d *driver) commonDeviceID() string { return d.name + "/gpu=common" }

// writeCommonSpec writes the spec of the device every claim names: the node's name.
func (d *driver) writeCommonSpec(node string) error {
	raw := &cdispec.Spec{
		Version: "0.3.0",
		Kind:    d.name + "/gpu",
		Devices: []cdispec.Device{{
			Name:           "common",
			ContainerEdits: cdispec.ContainerEdits{Env: []string{"HELPER_NODE_NAME=" + node}},
		}},
	}
	return d.cdiLibrary.WriteSpec(raw, d.name+"-common")
}

type settings struct {
	name, node, pluginDir, cdiDir, kubeconfig, registrarDir string
	gpus                                                    int
	cdiLibrary                                              bool
}

func main() {
	var s settings
	flag.StringVar(&s.name, "driver", "gpu.dra-testbed.io", "the driver's name")
	flag.StringVar(&s.node, "node", os.Getenv("NODE_NAME"), "the node's name")
	flag.StringVar(&s.pluginDir, "plugin-dir", "", "where the DRA socket and the checkpoint go "+
		"(default: <$KUBELET_PLUGINS_DIRECTORY_PATH>/<driver>)")
	flag.StringVar(&s.cdiDir, "cdi-dir", os.Getenv("CDI_DIR"), "where the CDI specs go")
	flag.StringVar(&s.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "the kubeconfig to read claims with")
	flag.StringVar(&s.registrarDir, "registrar-dir", os.Getenv("KUBELET_REGISTRAR_DIRECTORY_PATH"),
		"where the kubelet looks for registration sockets; empty: register with no kubelet")
	flag.IntVar(&s.gpus, "gpus", 0, "GPUs to publish for the node (with --registrar-dir)")
	flag.BoolVar(&s.cdiLibrary, "cdi-library", false, "write CDI specs with the CDI library (YAML), "+
		"with a common device every claim names, as drivers built on it do")
	flag.Parse()
	if s.pluginDir == "" && os.Getenv("KUBELET_PLUGINS_DIRECTORY_PATH") != "" {
		s.pluginDir = filepath.Join(os.Getenv("KUBELET_PLUGINS_DIRECTORY_PATH"), s.name)
	}
	if s.node == "" || s.pluginDir == "" || s.cdiDir == "" {
		fmt.Fprintln(os.Stderr, "testbed-helperdriver: --node, --plugin-dir and --cdi-dir are required "+
			"(or $NODE_NAME, $KUBELET_PLUGINS_DIRECTORY_PATH and $CDI_DIR, as on a synthetic node)")
		os.Exit(2)
	}
	if s.gpus > 0 && s.registrarDir == "" {
		fmt.Fprintln(os.Stderr, "testbed-helperdriver: --gpus needs --registrar-dir: devices for a node no kubelet knows the driver of")
		os.Exit(2)
	}
	if err := run(s); err != nil {
		fmt.Fprintln(os.Stderr, "testbed-helperdriver:", err)
		os.Exit(1)
	}
}

// gpus is the node's ResourceSlice content: n GPUs, each its own device.
func gpus(n int) []resourceapi.Device {
	model := "helper-gpu"
	devices := make([]resourceapi.Device, n)
	for i := range devices {
		devices[i] = resourceapi.Device{
			Name:       fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"model": {StringValue: &model}},
		}
	}
	return devices
}

func run(s settings) error {
	name, node, pluginDir, cdiDir, kubeconfig := s.name, s.node, s.pluginDir, s.cdiDir, s.kubeconfig
	config, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// The client's default 5 QPS would time the rate limiter, not the driver.
	config.QPS, config.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	for _, dir := range []string{pluginDir, cdiDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}
	checkpoints, err := checkpointmanager.NewCheckpointManager(pluginDir)
	if err != nil {
		return err
	}
	d := &driver{name: name, cdiDir: cdiDir, checkpoints: checkpoints}
	if s.cdiLibrary {
		if d.cdiLibrary, err = cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false)); err != nil {
			return err
		}
		if err := d.writeCommonSpec(node); err != nil {
			return fmt.Errorf("write the common CDI spec: %w", err)
		}
	}
	d.prepared.Claims = map[types.UID]map[string][]string{}
	if err := checkpoints.GetCheckpoint(checkpointName, &d.prepared); err != nil && !errors.Is(err, checkpointerrors.ErrCheckpointNotFound) {
		return fmt.Errorf("read checkpoint: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	options := []kubeletplugin.Option{
		kubeletplugin.DriverName(name),
		kubeletplugin.NodeName(node),
		kubeletplugin.KubeClient(client),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.HealthService(false),
	}
	if s.registrarDir == "" {
		options = append(options, kubeletplugin.RegistrationService(false))
	} else {
		options = append(options, kubeletplugin.RegistrarDirectoryPath(s.registrarDir))
		if uid := os.Getenv("POD_UID"); uid != "" {
			options = append(options, kubeletplugin.RollingUpdate(types.UID(uid)))
		}
	}
	helper, err := kubeletplugin.Start(ctx, d, options...)
	if err != nil {
		return err
	}
	if s.gpus > 0 {
		pool := resourceslice.Pool{Slices: []resourceslice.Slice{{Devices: gpus(s.gpus)}}}
		resources := resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{node: pool}}
		if err := helper.PublishResources(ctx, resources); err != nil {
			return err
		}
	}
	<-ctx.Done()
	helper.Stop()
	return nil
}
