// Command testbed-cri is the container runtime of a real-kubelet node in dra-testbed.
//
// It serves the upstream fake CRI runtime (k8s.io/cri-client/pkg/fake) on a unix
// socket and adds what a kubelet needs from a runtime that the fake leaves out:
// images with a size (the kubelet rejects size 0), containers with a log path (with an
// empty one the kubelet's garbage collector deletes files in its working directory),
// CDI device resolution against the node's spec files by the CDI library containerd
// and CRI-O use (.json and .yaml specs; an unresolvable device fails CreateContainer),
// and containers that end as their command says, read as the fake kubelet reads it
// (testbed/kubelet/commands.py): after `sleep N` (at once without one), with `exit N`'s
// status (0 without one); `sleep infinity`, or a command that neither sleeps nor exits,
// runs until stopped, unless it is an init container's (not a sidecar's): that one ends
// at once with 0, as the fake kubelet ends it. A runtime is not told which containers
// are init containers; with --kubeconfig (the kubelet's), the pod's spec is read to
// know, for such commands alone. A container the kubelet stops ends with status 143, as
// a process that exits on SIGTERM does (the upstream fake leaves 0: a pod deleted
// mid-run then turned Succeeded).
//
// Pod sandboxes get IPs from the node's pod CIDR, one each (ipam.go), where the fake
// gives every pod the same address.
//
// Every CreateContainer is appended to --record as one JSON line (pod, container, the
// CDI device IDs the kubelet passed and the environment they resolved to), so tests
// can check what a container really got.
//
// A file <namespace>_<pod>_<container> written into --exits, holding an exit code, ends
// that container (the one running, or the next to run) with that code: a process the
// testbed runs for the container (a node's DRA driver) exited, and the kubelet sees it
// as a container's exit, restarting it and counting it in the pod's status. Each
// StartContainer writes a file of that name into --starts (its content the time), so
// the testbed starts the process again when the kubelet, after its back-off, starts
// the container again.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode"

	"google.golang.org/grpc"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type runtime struct {
	*fake.RemoteRuntime
	cdi    *cdi.Cache
	pods   corev1client.PodsGetter // nil without --kubeconfig
	record string
	starts string
	ips    *ipam
	mu     sync.Mutex // guards commands and appends to record
	// commands holds each container's command and args, for how it ends.
	commands map[string]string
}

type containerRecord struct {
	Time       string            `json:"time"`
	Namespace  string            `json:"namespace"`
	Pod        string            `json:"pod"`
	PodUID     string            `json:"podUID"`
	Container  string            `json:"container"`
	CDIDevices []string          `json:"cdiDevices"`
	Env        map[string]string `json:"env"`
	Error      string            `json:"error,omitempty"`
}

// resolveCDI gives the environment a container gets for its CDI device IDs: the
// spec-level env edits of each spec involved (once), then each device's, as the CDI
// library's InjectDevices orders them. The specs are read afresh for each container,
// as a runtime's cache, told of every change, has them; a spec that does not validate
// is skipped, and a device two specs define is a conflict: both unresolvable. Device
// nodes and mounts are not applied (the node's hardware is emulated).
func (r *runtime) resolveCDI(ids []string) (map[string]string, error) {
	env := map[string]string{}
	if len(ids) == 0 {
		return env, nil
	}
	_ = r.cdi.Refresh() // its errors are per file, below
	var unresolved []string
	specs := map[*cdi.Spec]bool{}
	apply := func(entries []string) {
		for _, entry := range entries {
			key, value, _ := strings.Cut(entry, "=")
			env[key] = value
		}
	}
	for _, id := range ids {
		device := r.cdi.GetDevice(id)
		if device == nil {
			unresolved = append(unresolved, id)
			continue
		}
		if spec := device.GetSpec(); !specs[spec] {
			specs[spec] = true
			apply(spec.ContainerEdits.Env)
		}
		apply(device.ContainerEdits.Env)
	}
	if len(unresolved) > 0 {
		err := fmt.Errorf("unresolvable CDI devices %s", strings.Join(unresolved, ", "))
		if skipped := skippedSpecs(r.cdi.GetErrors()); skipped != "" {
			err = fmt.Errorf("%w (spec files skipped: %s)", err, skipped)
		}
		return env, err
	}
	return env, nil
}

// skippedSpecs names each spec file the CDI cache could not use and why, in order.
func skippedSpecs(errs map[string][]error) string {
	paths := make([]string, 0, len(errs))
	for path := range errs {
		paths = append(paths, path)
	}
	sort.Strings(paths)
	var parts []string
	for _, path := range paths {
		for _, err := range errs[path] {
			parts = append(parts, filepath.Base(path)+": "+err.Error())
		}
	}
	return strings.Join(parts, "; ")
}

func (r *runtime) appendRecord(rec containerRecord) {
	if r.record == "" {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	line, _ := json.Marshal(rec)
	f, err := os.OpenFile(r.record, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed-cri: cannot append to %s: %v\n", r.record, err)
		return
	}
	defer f.Close()
	_, _ = f.Write(append(line, '\n'))
}

func (r *runtime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	config, sandbox := req.GetConfig(), req.GetSandboxConfig()
	ids := make([]string, 0, len(config.GetCDIDevices()))
	for _, device := range config.GetCDIDevices() {
		ids = append(ids, device.GetName())
	}
	env, cdiErr := r.resolveCDI(ids)
	rec := containerRecord{
		Time:       time.Now().UTC().Format(time.RFC3339Nano),
		Namespace:  sandbox.GetMetadata().GetNamespace(),
		Pod:        sandbox.GetMetadata().GetName(),
		PodUID:     sandbox.GetMetadata().GetUid(),
		Container:  config.GetMetadata().GetName(),
		CDIDevices: ids,
		Env:        env,
	}
	if cdiErr != nil {
		rec.Error = cdiErr.Error()
		r.appendRecord(rec)
		return nil, fmt.Errorf("failed to inject CDI devices: %w", cdiErr)
	}
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	r.appendRecord(rec)
	logPath := filepath.Join(sandbox.GetLogDirectory(), config.GetLogPath())
	if sandbox.GetLogDirectory() != "" && config.GetLogPath() != "" {
		_ = os.MkdirAll(filepath.Dir(logPath), 0o755)
		if f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		}
	}
	service := r.RuntimeService
	service.Lock()
	if c, ok := service.Containers[resp.GetContainerId()]; ok {
		c.LogPath = logPath
	}
	service.Unlock()
	command := strings.Join(append(append([]string{}, config.GetCommand()...), config.GetArgs()...), " ")
	if _, _, _, told := ending(command); !told && r.isInitContainer(ctx, sandbox.GetMetadata(), config.GetMetadata().GetName()) {
		command += "; exit 0" // ends at once with 0, as the fake kubelet ends it
	}
	r.mu.Lock()
	r.commands[resp.GetContainerId()] = command
	r.mu.Unlock()
	return resp, nil
}

// isInitContainer says whether the pod's spec has the container among its init
// containers, sidecars (restartPolicy Always) aside. False when it cannot be read.
func (r *runtime) isInitContainer(ctx context.Context, pod *runtimeapi.PodSandboxMetadata, container string) bool {
	if r.pods == nil {
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	spec, err := r.pods.Pods(pod.GetNamespace()).Get(ctx, pod.GetName(), metav1.GetOptions{})
	if err == nil && string(spec.UID) != pod.GetUid() {
		err = fmt.Errorf("the pod of that name now has UID %s", spec.UID)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed-cri: cannot tell whether %s/%s's container %s is an init container: %v\n",
			pod.GetNamespace(), pod.GetName(), container, err)
		return false
	}
	for _, c := range spec.Spec.InitContainers {
		if c.Name == container {
			return c.RestartPolicy == nil || *c.RestartPolicy != "Always"
		}
	}
	return false
}

// words splits a container's command and args as the fake kubelet does: at spaces and
// semicolons, quotes trimmed.
func words(command string) []string {
	var out []string
	for _, word := range strings.FieldsFunc(command, func(r rune) bool { return unicode.IsSpace(r) || r == ';' }) {
		if word = strings.Trim(word, `"'`); word != "" {
			out = append(out, word)
		}
	}
	return out
}

// ending reads how a container's command ends: after its first `sleep N` (at once
// without one), with its first `exit N`'s status (0 without one); ends is false if it
// runs until stopped (`sleep infinity`, or neither a sleep nor an exit). told is false
// when the command says nothing of its end (neither a sleep nor an exit).
func ending(command string) (seconds float64, code int32, ends, told bool) {
	ws := words(command)
	slept, exits := false, false
	for i := 0; i+1 < len(ws); i++ {
		if ws[i] == "sleep" || strings.HasSuffix(ws[i], "/sleep") {
			// ParseFloat takes "infinity": `sleep infinity` runs until stopped.
			value, err := strconv.ParseFloat(ws[i+1], 64)
			if err == nil && math.IsInf(value, 1) {
				return 0, 0, false, true
			}
			if err == nil && value >= 0 {
				seconds, slept = value, true
			}
			break
		}
	}
	for i := 0; i+1 < len(ws); i++ {
		if ws[i] == "exit" {
			if value, err := strconv.ParseUint(ws[i+1], 10, 64); err == nil {
				code, exits = int32(value%256), true
				break
			}
		}
	}
	return seconds, code, slept || exits, slept || exits
}

func (r *runtime) StartContainer(ctx context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	resp, err := r.RemoteRuntime.StartContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	service := r.RuntimeService
	r.mu.Lock()
	command := r.commands[req.GetContainerId()]
	r.mu.Unlock()
	r.tellStarted(req.GetContainerId())
	if seconds, code, ends, _ := ending(command); ends {
		id := req.GetContainerId()
		time.AfterFunc(time.Duration(seconds*float64(time.Second)), func() {
			service.Lock()
			defer service.Unlock()
			if c, ok := service.Containers[id]; ok && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
				c.State = runtimeapi.ContainerState_CONTAINER_EXITED
				c.FinishedAt = time.Now().UnixNano()
				c.ExitCode = code
				// As containerd words an exit.
				c.Reason = "Completed"
				if code != 0 {
					c.Reason = "Error"
				}
			}
		})
	}
	return resp, nil
}

// stoppedExitCode is how a container stopped by the kubelet ends: as a process that
// exits on SIGTERM, the status containerd reports for it (the fake kubelet's too).
const stoppedExitCode = 128 + int32(syscall.SIGTERM)

// StopContainer ends a running container with stoppedExitCode. The upstream fake leaves
// its status at 0, so a pod deleted mid-run (a drain, a Job's pod evicted) turned
// Succeeded on the reference node and its Job counted it done, where any runtime fails
// it. A container that already exited keeps its status and finishing time.
func (r *runtime) StopContainer(ctx context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	service := r.RuntimeService
	service.Lock()
	c, ok := service.Containers[req.GetContainerId()]
	if ok && c.State == runtimeapi.ContainerState_CONTAINER_RUNNING {
		c.State = runtimeapi.ContainerState_CONTAINER_EXITED
		c.FinishedAt = time.Now().UnixNano()
		c.ExitCode = stoppedExitCode
		c.Reason = "Error"
	}
	exited := ok && c.State == runtimeapi.ContainerState_CONTAINER_EXITED
	service.Unlock()
	if exited {
		return &runtimeapi.StopContainerResponse{}, nil
	}
	return r.RemoteRuntime.StopContainer(ctx, req) // not there, or never started: as upstream answers
}

// labelsOf names the pod and container the kubelet created a container for.
const (
	podNamespaceLabel = "io.kubernetes.pod.namespace"
	podNameLabel      = "io.kubernetes.pod.name"
	containerLabel    = "io.kubernetes.container.name"
)

// exitKey is the file name in --exits that ends a container of this pod.
func exitKey(labels map[string]string) string {
	return labels[podNamespaceLabel] + "_" + labels[podNameLabel] + "_" + labels[containerLabel]
}

// tellStarted writes the container's start into --starts, whole or not at all.
func (r *runtime) tellStarted(id string) {
	if r.starts == "" {
		return
	}
	service := r.RuntimeService
	service.Lock()
	c, ok := service.Containers[id]
	var key string
	if ok {
		key = exitKey(c.Labels)
	}
	service.Unlock()
	if !ok {
		return
	}
	path := filepath.Join(r.starts, key)
	partial := filepath.Join(r.starts, "."+key)
	if err := os.WriteFile(partial, []byte(time.Now().UTC().Format(time.RFC3339Nano)+"\n"), 0o644); err == nil {
		_ = os.Rename(partial, path)
	}
}

// parseExit reads an exit file's content: a code of 0-255 (as a shell folds larger ones).
func parseExit(content string) (int32, error) {
	value, err := strconv.ParseUint(strings.TrimSpace(content), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("want an exit code, got %q", strings.TrimSpace(content))
	}
	return int32(value % 256), nil
}

// endRunning ends the running container the key names; false when none runs (yet).
func (r *runtime) endRunning(key string, code int32) bool {
	service := r.RuntimeService
	service.Lock()
	defer service.Unlock()
	for _, c := range service.Containers {
		if c.State == runtimeapi.ContainerState_CONTAINER_RUNNING && exitKey(c.Labels) == key {
			c.State = runtimeapi.ContainerState_CONTAINER_EXITED
			c.FinishedAt = time.Now().UnixNano()
			c.ExitCode = code
			c.Reason = "Error"
			if code == 0 {
				c.Reason = "Completed"
			}
			return true
		}
	}
	return false
}

// followExits applies the exit files in dir as they come (see the package comment); a
// file for a container not running yet waits for it, a malformed one is reported and removed.
func (r *runtime) followExits(dir string) {
	for range time.Tick(100 * time.Millisecond) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, entry := range entries {
			name := entry.Name()
			if strings.HasPrefix(name, ".") || entry.IsDir() {
				continue // a file being written (renamed into place when whole)
			}
			path := filepath.Join(dir, name)
			content, err := os.ReadFile(path)
			if err != nil {
				continue
			}
			code, err := parseExit(string(content))
			if err != nil {
				fmt.Fprintf(os.Stderr, "testbed-cri: exit file %s: %v; removed\n", path, err)
				_ = os.Remove(path)
				continue
			}
			if r.endRunning(name, code) {
				fmt.Fprintf(os.Stderr, "testbed-cri: container %s exited with %d\n", name, code)
				_ = os.Remove(path)
			}
		}
	}
}

func main() {
	listen := flag.String("listen", "", "unix socket to serve the CRI on (required)")
	cdiDirs := flag.String("cdi-dirs", "", "comma-separated directories of CDI spec files")
	record := flag.String("record", "", "append one JSON line per CreateContainer to this file")
	imageSize := flag.Uint64("image-size", 64<<20, "size reported for every image, in bytes")
	exits := flag.String("exits", "", "a directory of exit files that end containers (see the package comment)")
	starts := flag.String("starts", "", "a directory this writes a file into at each container's start")
	kubeconfig := flag.String("kubeconfig", "", "credentials to read pods with (the kubelet's), to tell init containers")
	flag.Parse()
	if *listen == "" {
		fmt.Fprintln(os.Stderr, "testbed-cri: --listen is required (a unix socket path)")
		os.Exit(2)
	}
	inner := fake.NewFakeRemoteRuntime()
	inner.ImageService.SetFakeImageSize(*imageSize)
	inner.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{
		Conditions: []*runtimeapi.RuntimeCondition{
			{Type: runtimeapi.RuntimeReady, Status: true},
			{Type: runtimeapi.NetworkReady, Status: true},
		},
	}
	r := &runtime{RemoteRuntime: inner, record: *record, starts: *starts, ips: newIPAM(), commands: map[string]string{}}
	if *kubeconfig != "" {
		config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err == nil {
			r.pods, err = corev1client.NewForConfig(config)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "testbed-cri: --kubeconfig: %v\n", err)
			os.Exit(1)
		}
	}
	if *starts != "" {
		if err := os.MkdirAll(*starts, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "testbed-cri: --starts: %v\n", err)
			os.Exit(1)
		}
	}
	var specDirs []string
	for _, dir := range strings.Split(*cdiDirs, ",") {
		if dir != "" {
			specDirs = append(specDirs, dir)
		}
	}
	// Refreshed for each container rather than told of changes by inotify: no window in
	// which a spec the driver has just written is not yet seen.
	r.cdi, _ = cdi.NewCache(cdi.WithSpecDirs(specDirs...), cdi.WithAutoRefresh(false))
	if *exits != "" {
		if err := os.MkdirAll(*exits, 0o755); err != nil {
			fmt.Fprintf(os.Stderr, "testbed-cri: --exits: %v\n", err)
			os.Exit(1)
		}
		go r.followExits(*exits)
	}
	listener, err := util.CreateListener("unix://" + *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testbed-cri: %v\n", err)
		os.Exit(1)
	}
	server := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(server, r)
	runtimeapi.RegisterImageServiceServer(server, r)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		server.Stop()
	}()
	fmt.Fprintf(os.Stderr, "testbed-cri: serving on %s\n", *listen)
	if err := server.Serve(listener); err != nil {
		fmt.Fprintf(os.Stderr, "testbed-cri: %v\n", err)
		os.Exit(1)
	}
	_ = os.Remove(*listen)
}
