package main

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

func TestAddressesComeFromThePodCIDRNextAfterTheLastAndFreedOnStop(t *testing.T) {
	a := newIPAM()
	if ip, err := a.assign("s0"); ip != "" || err != nil {
		t.Fatalf("without a CIDR: %q, %v", ip, err)
	}
	if err := a.setCIDR("10.244.1.0/29,fd00::/64"); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, sandbox := range []string{"s1", "s2", "s3"} {
		ip, err := a.assign(sandbox)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ip)
	}
	if strings.Join(got, " ") != "10.244.1.2 10.244.1.3 10.244.1.4" {
		t.Errorf("assigned %v; want .2 .3 .4 (.1 the gateway)", got)
	}
	if again, _ := a.assign("s2"); again != "10.244.1.3" {
		t.Errorf("a sandbox asked again got %s", again)
	}
	a.release("s1")
	for _, want := range []string{"10.244.1.5", "10.244.1.6", "10.244.1.2"} { // .7 is the broadcast
		if ip, _ := a.assign("n-" + want); ip != want {
			t.Errorf("got %s; want %s (next after the last, then wrapping to the freed)", ip, want)
		}
	}
	if _, err := a.assign("one-too-many"); err == nil || !strings.Contains(err.Error(), "no IP addresses available") {
		t.Errorf("a full range answered %v", err)
	}
	if ip := nth(netip.MustParseAddr("fd00::"), 258); ip != "fd00::102" {
		t.Errorf("nth = %s", ip)
	}
}

func TestASandboxShowsItsOwnAddressAndOneOnTheHostsNetworkNone(t *testing.T) {
	r := &runtime{RemoteRuntime: fake.NewFakeRemoteRuntime(), ips: newIPAM(), commands: map[string]string{}}
	ctx := context.Background()
	config := &runtimeapi.UpdateRuntimeConfigRequest{RuntimeConfig: &runtimeapi.RuntimeConfig{
		NetworkConfig: &runtimeapi.NetworkConfig{PodCidr: "10.244.7.0/24"},
	}}
	if _, err := r.UpdateRuntimeConfig(ctx, config); err != nil {
		t.Fatal(err)
	}
	sandbox := func(name string, host bool) string {
		c := &runtimeapi.PodSandboxConfig{Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "ns", Uid: name}}
		if host {
			c.Linux = &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
				NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
			}}
		}
		resp, err := r.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: c})
		if err != nil {
			t.Fatal(err)
		}
		status, err := r.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: resp.GetPodSandboxId()})
		if err != nil {
			t.Fatal(err)
		}
		return status.GetStatus().GetNetwork().GetIp()
	}
	if a, b := sandbox("a", false), sandbox("b", false); a != "10.244.7.2" || b != "10.244.7.3" {
		t.Errorf("pods got %s and %s", a, b)
	}
	if host := sandbox("h", true); strings.HasPrefix(host, "10.244.7.") {
		t.Errorf("a host-network pod got a pod address %s", host)
	}
}
