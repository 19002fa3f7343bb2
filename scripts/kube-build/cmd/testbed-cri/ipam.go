package main

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// ipam hands out pod IPs from the node's pod CIDR, which the kubelet gives the runtime
// (UpdateRuntimeConfig) once its Node has one, as CNI's host-local IPAM does and the
// fake kubelet does too (testbed/kubelet/podnetwork.py): the subnet's first address is
// the gateway, each new sandbox gets the next free address after the last one handed
// out, and an address is freed when its sandbox stops. Without a CIDR (or for a pod on
// the host's network) the fake runtime's own answer stands.
type ipam struct {
	mu        sync.Mutex
	prefix    netip.Prefix
	last      int // offset in the subnet of the address last handed out
	bySandbox map[string]string
	taken     map[string]bool
}

// mostAddresses bounds the range walked in a large (IPv6) subnet.
const mostAddresses = 1 << 16

func newIPAM() *ipam {
	return &ipam{last: -1, bySandbox: map[string]string{}, taken: map[string]bool{}}
}

// setCIDR takes the first of the kubelet's comma-separated pod CIDRs.
func (a *ipam) setCIDR(cidrs string) error {
	first := strings.TrimSpace(strings.Split(cidrs, ",")[0])
	if first == "" {
		return nil
	}
	prefix, err := netip.ParsePrefix(first)
	if err != nil {
		return fmt.Errorf("pod CIDR %q: %w", first, err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if prefix = prefix.Masked(); prefix != a.prefix { // a Node made again with another CIDR
		a.prefix, a.last = prefix, -1
	}
	return nil
}

// assign gives the sandbox its address; "" without a CIDR, an error when none is free.
func (a *ipam) assign(sandbox string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.bySandbox[sandbox]; ok {
		return ip, nil
	}
	if !a.prefix.IsValid() {
		return "", nil
	}
	hostBits := a.prefix.Addr().BitLen() - a.prefix.Bits()
	end := mostAddresses
	if hostBits < 16 {
		end = 1 << hostBits
		if a.prefix.Addr().Is4() {
			end-- // before IPv4's broadcast
		}
	}
	first := 2 // after the subnet's own address and its gateway
	count := end - first
	start := first
	if a.last >= first && a.last < end {
		start = a.last + 1
	}
	for step := 0; step < count; step++ {
		offset := first + (start-first+step)%count
		ip := nth(a.prefix.Addr(), offset)
		if !a.taken[ip] {
			a.last, a.taken[ip], a.bySandbox[sandbox] = offset, true, ip
			return ip, nil
		}
	}
	return "", fmt.Errorf("no IP addresses available in range %s (%d pods hold them)", a.prefix, len(a.taken))
}

func (a *ipam) address(sandbox string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bySandbox[sandbox]
}

func (a *ipam) release(sandbox string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if ip, ok := a.bySandbox[sandbox]; ok {
		delete(a.bySandbox, sandbox)
		delete(a.taken, ip)
	}
}

// nth is the address offset after base.
func nth(base netip.Addr, offset int) string {
	bytes := base.AsSlice()
	for i := len(bytes) - 1; i >= 0 && offset > 0; i-- {
		sum := int(bytes[i]) + offset&0xff
		bytes[i] = byte(sum)
		offset = offset>>8 + sum>>8
	}
	addr, _ := netip.AddrFromSlice(bytes)
	return addr.String()
}

func onHostNetwork(config *runtimeapi.PodSandboxConfig) bool {
	return config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
}

func (r *runtime) UpdateRuntimeConfig(ctx context.Context, req *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	if err := r.ips.setCIDR(req.GetRuntimeConfig().GetNetworkConfig().GetPodCidr()); err != nil {
		return nil, err
	}
	return r.RemoteRuntime.UpdateRuntimeConfig(ctx, req)
}

func (r *runtime) RunPodSandbox(ctx context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	resp, err := r.RemoteRuntime.RunPodSandbox(ctx, req)
	if err != nil || onHostNetwork(req.GetConfig()) {
		return resp, err
	}
	if _, err := r.ips.assign(resp.GetPodSandboxId()); err != nil {
		// As a runtime whose CNI plugin failed: no sandbox is left behind.
		_, _ = r.RemoteRuntime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: resp.GetPodSandboxId()})
		return nil, fmt.Errorf("failed to setup network for sandbox %q: plugin type=\"host-local\" failed (add): %w", resp.GetPodSandboxId(), err)
	}
	return resp, nil
}

func (r *runtime) PodSandboxStatus(ctx context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	resp, err := r.RemoteRuntime.PodSandboxStatus(ctx, req)
	if err != nil {
		return nil, err
	}
	if ip := r.ips.address(req.GetPodSandboxId()); ip != "" && resp.GetStatus() != nil {
		resp.Status.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: ip}
	}
	return resp, nil
}

func (r *runtime) StopPodSandbox(ctx context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	resp, err := r.RemoteRuntime.StopPodSandbox(ctx, req)
	if err == nil {
		r.ips.release(req.GetPodSandboxId()) // the network torn down with the sandbox
	}
	return resp, err
}

func (r *runtime) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	r.ips.release(req.GetPodSandboxId())
	return r.RemoteRuntime.RemovePodSandbox(ctx, req)
}
