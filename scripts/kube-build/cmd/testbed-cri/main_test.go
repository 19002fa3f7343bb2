package main

import (
	"context"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	apitest "k8s.io/cri-api/pkg/apis/testing"
	"k8s.io/cri-client/pkg/fake"
)

func TestEnding(t *testing.T) {
	cases := []struct {
		command string
		seconds float64
		code    int32
		ends    bool
		told    bool
	}{
		{"sleep 5", 5, 0, true, true},
		{"/bin/sleep 0.5", 0.5, 0, true, true},
		{"sh -c sleep 3 && echo done", 3, 0, true, true},
		{"sh -c sleep 2; exit 3", 2, 3, true, true},
		{"sh -c sleep '1.5' && exit 1", 1.5, 1, true, true},
		{"sh -c exit 1", 0, 1, true, true},
		{"sh -c exit 256", 0, 0, true, true},
		{"sleep infinity", 0, 0, false, true}, // runs until stopped, not "exits at once"
		{"sleep inf; exit 1", 0, 0, false, true},
		{"sleep NaN", 0, 0, false, false},
		{"sleep -1", 0, 0, false, false},
		{"run-forever", 0, 0, false, false},
		{"bash -c export", 0, 0, false, false},
	}
	for _, c := range cases {
		seconds, code, ends, told := ending(c.command)
		if ends != c.ends || told != c.told || (ends && (seconds != c.seconds || code != c.code)) {
			t.Errorf("ending(%q) = %v, %v, %v, %v; want %v, %v, %v, %v",
				c.command, seconds, code, ends, told, c.seconds, c.code, c.ends, c.told)
		}
	}
}

func TestExitFiles(t *testing.T) {
	key := exitKey(map[string]string{podNamespaceLabel: "dra-testbed", podNameLabel: "drv-n1", containerLabel: "driver"})
	if key != "dra-testbed_drv-n1_driver" {
		t.Errorf("exitKey = %q", key)
	}
	for content, want := range map[string]int32{"137\n": 137, "0": 0, "256": 0} {
		if code, err := parseExit(content); err != nil || code != want {
			t.Errorf("parseExit(%q) = %v, %v; want %v", content, code, err, want)
		}
	}
	for _, bad := range []string{"", "-1", "x"} {
		if _, err := parseExit(bad); err == nil {
			t.Errorf("parseExit(%q) took it", bad)
		}
	}
}

func TestAnExitFileEndsTheRunningContainerOfItsPod(t *testing.T) {
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), commands: map[string]string{}}
	labels := map[string]string{podNamespaceLabel: "dra-testbed", podNameLabel: "drv-n1", containerLabel: "driver"}
	if r.endRunning(exitKey(labels), 137) {
		t.Fatal("ended a container that is not there")
	}
	r.RuntimeService.Containers["c1"] = &apitest.FakeContainer{ContainerStatus: runtimeapi.ContainerStatus{
		Id: "c1", Labels: labels, State: runtimeapi.ContainerState_CONTAINER_RUNNING,
	}}
	if r.endRunning("dra-testbed_other_driver", 1) {
		t.Fatal("ended another pod's container")
	}
	if !r.endRunning(exitKey(labels), 137) {
		t.Fatal("did not end the running container")
	}
	c := r.RuntimeService.Containers["c1"]
	if c.State != runtimeapi.ContainerState_CONTAINER_EXITED || c.ExitCode != 137 || c.Reason != "Error" {
		t.Errorf("container now %v, code %d, reason %q", c.State, c.ExitCode, c.Reason)
	}
	if r.endRunning(exitKey(labels), 137) {
		t.Error("ended an exited container again")
	}
}

func TestAContainersStartIsToldInStarts(t *testing.T) {
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), commands: map[string]string{}, starts: t.TempDir()}
	labels := map[string]string{podNamespaceLabel: "dra-testbed", podNameLabel: "drv-n1", containerLabel: "driver"}
	r.RuntimeService.Containers["c1"] = &apitest.FakeContainer{ContainerStatus: runtimeapi.ContainerStatus{
		Id: "c1", Labels: labels, State: runtimeapi.ContainerState_CONTAINER_RUNNING,
	}}
	r.tellStarted("c1")
	r.tellStarted("gone")
	entries, err := os.ReadDir(r.starts)
	if err != nil || len(entries) != 1 || entries[0].Name() != exitKey(labels) {
		t.Fatalf("starts holds %v (%v); want only %s", entries, err, exitKey(labels))
	}
}

// The example driver's demo runs `bash -c export` as an init container: it ends, and the
// pod's own container, whose command says nothing either, runs until stopped.
func TestAnInitContainerWhoseCommandSaysNothingEndsAtOnce(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u1"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "init"}, {Name: "sidecar", RestartPolicy: &always}},
			Containers:     []corev1.Container{{Name: "main"}},
		},
	}
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), commands: map[string]string{}, pods: kubefake.NewSimpleClientset(pod).CoreV1()}
	sandbox := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Namespace: "ns", Name: "p", Uid: "u1"}}
	ended := map[string]bool{}
	for _, name := range []string{"init", "sidecar", "main"} {
		resp, err := r.CreateContainer(context.Background(), &runtimeapi.CreateContainerRequest{
			SandboxConfig: sandbox,
			Config: &runtimeapi.ContainerConfig{
				Metadata: &runtimeapi.ContainerMetadata{Name: name},
				Image:    &runtimeapi.ImageSpec{Image: "ubuntu:22.04"},
				Command:  []string{"bash", "-c"}, Args: []string{"export"},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		seconds, code, ends, _ := ending(r.commands[resp.GetContainerId()])
		ended[name] = ends && seconds == 0 && code == 0
	}
	if !ended["init"] || ended["sidecar"] || ended["main"] {
		t.Errorf("ends at once: %v; want the init container alone", ended)
	}
	other := &runtimeapi.PodSandboxMetadata{Namespace: "ns", Name: "p", Uid: "another pod of that name"}
	if r.isInitContainer(context.Background(), other, "init") {
		t.Error("read another pod's spec")
	}
}

func TestAStoppedContainerEndsAsOnSIGTERMAndAnExitedOneKeepsItsEnd(t *testing.T) {
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), commands: map[string]string{}}
	r.RuntimeService.Containers["running"] = &apitest.FakeContainer{ContainerStatus: runtimeapi.ContainerStatus{
		Id: "running", State: runtimeapi.ContainerState_CONTAINER_RUNNING,
	}}
	r.RuntimeService.Containers["done"] = &apitest.FakeContainer{ContainerStatus: runtimeapi.ContainerStatus{
		Id: "done", State: runtimeapi.ContainerState_CONTAINER_EXITED, ExitCode: 3, Reason: "Error", FinishedAt: 42,
	}}
	for _, id := range []string{"running", "done"} {
		if _, err := r.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: id}); err != nil {
			t.Fatalf("StopContainer(%s): %v", id, err)
		}
	}
	if c := r.RuntimeService.Containers["running"]; c.State != runtimeapi.ContainerState_CONTAINER_EXITED ||
		c.ExitCode != 143 || c.Reason != "Error" || c.FinishedAt == 0 {
		t.Errorf("stopped container now %v, code %d, reason %q, finished %d", c.State, c.ExitCode, c.Reason, c.FinishedAt)
	}
	if c := r.RuntimeService.Containers["done"]; c.ExitCode != 3 || c.FinishedAt != 42 {
		t.Errorf("an exited container changed: code %d, finished %d", c.ExitCode, c.FinishedAt)
	}
	if _, err := r.StopContainer(context.Background(), &runtimeapi.StopContainerRequest{ContainerId: "gone"}); err == nil {
		t.Error("stopped a container that is not there")
	}
}
