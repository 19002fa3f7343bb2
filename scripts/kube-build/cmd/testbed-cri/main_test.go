package main

import (
	"os"
	"testing"

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
	}{
		{"sleep 5", 5, 0, true},
		{"/bin/sleep 0.5", 0.5, 0, true},
		{"sh -c sleep 3 && echo done", 3, 0, true},
		{"sh -c sleep 2; exit 3", 2, 3, true},
		{"sh -c sleep '1.5' && exit 1", 1.5, 1, true},
		{"sh -c exit 1", 0, 1, true},
		{"sh -c exit 256", 0, 0, true},
		{"sleep infinity", 0, 0, false}, // runs until stopped, not "exits at once"
		{"sleep inf; exit 1", 0, 0, false},
		{"sleep NaN", 0, 0, false},
		{"sleep -1", 0, 0, false},
		{"run-forever", 0, 0, false},
	}
	for _, c := range cases {
		seconds, code, ends := ending(c.command)
		if ends != c.ends || (ends && (seconds != c.seconds || code != c.code)) {
			t.Errorf("ending(%q) = %v, %v, %v; want %v, %v, %v", c.command, seconds, code, ends, c.seconds, c.code, c.ends)
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
